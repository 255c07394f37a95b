-- Attention items (SPEC §12): what the owner should look at; repeats count on one open row.

CREATE TABLE attention_items (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    employee    text NOT NULL,
    kind        text NOT NULL,
    severity    text NOT NULL CHECK (severity IN ('info', 'warning', 'error')),
    ref         text NOT NULL,
    detail      text,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    count       integer NOT NULL DEFAULT 1,
    state       text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'resolved'))
);
CREATE UNIQUE INDEX attention_items_open ON attention_items (kind, ref) WHERE state = 'open';
