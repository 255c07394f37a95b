-- Supervision (SPEC §7, I2, I10): owner intents and their deliverer, the supervisor's control
-- block on the generation (state, revision, limits), start-once, and supervisor rebuilds.

ALTER TABLE generations
    ADD COLUMN control_revision integer NOT NULL DEFAULT 0,
    ADD COLUMN limits jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN start_fired_at timestamptz;

-- An owner action that needs Temporal: written with the database change, answered at once,
-- applied in the background by workflow id with a stable Update id (`intent-<id>`).
CREATE TABLE intents (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    employee         text REFERENCES employees (name),  -- NULL: instance-wide (rearm)
    generation       integer,
    kind             text NOT NULL
                     CHECK (kind IN ('start', 'stop', 'resume', 'reset', 'interrupt', 'limits',
                                     'rearm')),
    revision         integer,  -- the control revision a supervisor intent sets
    payload          jsonb NOT NULL DEFAULT '{}',
    state            text NOT NULL DEFAULT 'applying'
                     CHECK (state IN ('applying', 'applied', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    outcome          text,  -- what applying did, or the last attempt's error
    created_at       timestamptz NOT NULL DEFAULT now(),
    applied_at       timestamptz
);
-- The deliverer's work list: the open intents, oldest first per employee.
CREATE INDEX intents_applying ON intents (employee, id) WHERE state = 'applying';

-- Each time a lost supervisor was started again from the database.
CREATE TABLE supervisor_rebuilds (
    employee    text NOT NULL,
    generation  integer NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (employee, generation) REFERENCES generations (employee, generation)
);
CREATE INDEX supervisor_rebuilds_recent ON supervisor_rebuilds (employee, generation, at);
