-- Scheduler and budgets (SPEC §9): admission waiters with round-robin memory, the reserved
-- owner slot on a lease, and the daily spend ledger.

ALTER TABLE sched_leases
    ADD COLUMN reserved boolean NOT NULL DEFAULT false,  -- the employee's reserved owner slot
    ADD COLUMN stream_key text,
    ADD COLUMN suspended_reason text,
    ADD COLUMN suspended_at timestamptz;

-- The watchdog's view of a turn: its last completed step, the time it held no slot (suspended
-- or parked: not counted toward slowness), and what the watchdog already did.
ALTER TABLE turns
    ADD COLUMN last_step_at timestamptz,
    ADD COLUMN held_s double precision NOT NULL DEFAULT 0,
    ADD COLUMN slow_alerted_at timestamptz,
    ADD COLUMN backstop_at timestamptz,
    ADD COLUMN admission_wait_s double precision,
    ADD COLUMN parked_at timestamptz;
CREATE INDEX turns_running ON turns (started_at) WHERE status = 'running';

-- An entity waiting for a slot (one per stream: an entity asks for one turn at a time).
-- Release offers slots to waiters; an offered waiter's next ask is granted.
CREATE TABLE sched_waiters (
    stream_key    text PRIMARY KEY,
    employee      text NOT NULL,
    generation    integer NOT NULL,
    agent         text NOT NULL,
    thread        text NOT NULL,
    class         smallint NOT NULL,
    workflow_id   text NOT NULL,  -- the entity that is woken with `wake`
    turn_id       text,           -- a suspended turn asking for its slot again
    requested_at  timestamptz NOT NULL DEFAULT now(),
    asked_at      timestamptz NOT NULL DEFAULT now(),
    offered_at    timestamptz
);

-- Round-robin between employees within a class: who was served last.
CREATE TABLE sched_rounds (
    class      smallint NOT NULL,
    employee   text NOT NULL,
    served_at  timestamptz NOT NULL,
    PRIMARY KEY (class, employee)
);

-- The daily budget of an employee: its limit, its period (the owner's midnight plus a stable
-- offset of 0-10 minutes, as UTC instants) and the ledger's state.
CREATE TABLE employee_budgets (
    employee      text PRIMARY KEY REFERENCES employees (name),
    daily_usd     numeric(12, 4),  -- NULL: no limit
    timezone      text NOT NULL,
    offset_s      integer NOT NULL CHECK (offset_s BETWEEN 0 AND 600),
    period_start  timestamptz NOT NULL,
    period_end    timestamptz NOT NULL,
    state         text NOT NULL DEFAULT 'normal' CHECK (state IN ('normal', 'high', 'max')),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE employee_spend (
    employee      text NOT NULL REFERENCES employees (name),
    period_start  timestamptz NOT NULL,
    reserved_usd  numeric(14, 6) NOT NULL DEFAULT 0,
    spent_usd     numeric(14, 6) NOT NULL DEFAULT 0,
    PRIMARY KEY (employee, period_start)
);

-- One row per paid attempt: the key makes a retried reservation or settlement count once.
CREATE TABLE spend_events (
    key            text PRIMARY KEY,  -- {workflow_id}:{activity_id}[:{attempt}]
    employee       text NOT NULL,
    period_start   timestamptz NOT NULL,
    turn_id        text NOT NULL,
    class          smallint NOT NULL,
    model          text NOT NULL,
    estimate_usd   numeric(14, 6) NOT NULL,
    actual_usd     numeric(14, 6),
    input_tokens   integer,
    output_tokens  integer,
    state          text NOT NULL DEFAULT 'reserved'
                   CHECK (state IN ('reserved', 'settled', 'released')),
    created_at     timestamptz NOT NULL DEFAULT now(),
    settled_at     timestamptz
);
CREATE INDEX spend_events_turn ON spend_events (turn_id);

-- The owner's chat shows notices (budget paused, resumed) besides runs and replies.
ALTER TABLE chat_events DROP CONSTRAINT chat_events_kind_check;
ALTER TABLE chat_events ADD CONSTRAINT chat_events_kind_check
    CHECK (kind IN ('run.start', 'run.input_merged', 'reply', 'notice'));

-- Provider rate limits (SPEC §9): a token bucket per credential and class (requests and tokens
-- per minute from configuration), shared by every LLM worker; a credential paused by a 429
-- with Retry-After waits for every class.
CREATE TABLE provider_buckets (
    credential   text NOT NULL,
    class        smallint NOT NULL,
    requests     double precision NOT NULL,
    tokens       double precision NOT NULL,
    refilled_at  timestamptz NOT NULL,
    PRIMARY KEY (credential, class)
);

CREATE TABLE provider_pauses (
    credential  text PRIMARY KEY,
    until       timestamptz NOT NULL,
    reason      text NOT NULL
);
