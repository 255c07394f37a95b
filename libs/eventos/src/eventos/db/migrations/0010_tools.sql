-- Tools (issue 13): every tool call a turn makes, by its id (turn, tool call), so a retried
-- attempt knows what the earlier one did. An `unsafe` call is `calling` (committed) from just
-- before it may reach the outside world: an attempt that finds it so marks it `unknown`
-- (SPEC §11) instead of calling again. Attention items may offer an action (`retry`).
CREATE TABLE tool_calls (
    id          text PRIMARY KEY,
    employee    text NOT NULL,
    generation  integer NOT NULL,
    lane        text NOT NULL,
    thread      text NOT NULL,
    route       jsonb NOT NULL,
    turn_id     text NOT NULL,
    name        text NOT NULL,
    effect      text NOT NULL CHECK (effect IN ('read_only', 'idempotent', 'unsafe')),
    arguments   jsonb NOT NULL,
    status      text NOT NULL CHECK (status IN ('calling', 'done', 'unknown')),
    outcome     text,
    result      text,
    attempts    integer NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    called_at   timestamptz,
    finished_at timestamptz,
    retry_of    text
);
CREATE INDEX tool_calls_employee ON tool_calls (employee, created_at);
ALTER TABLE attention_items ADD COLUMN action text;
