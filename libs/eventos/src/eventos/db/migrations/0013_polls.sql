-- Poll triggers (issue 13): one row per poll trigger of a generation. The cursor advances in
-- the same transaction as the page it read is appended; `revision` fences a stale attempt.
CREATE TABLE poll_cursors (
    employee        text NOT NULL,
    generation      integer NOT NULL,
    trigger_name    text NOT NULL,
    cursor          text,
    failures        integer NOT NULL DEFAULT 0,
    interval_s      integer NOT NULL,
    revision        bigint NOT NULL DEFAULT 0,
    appended        bigint NOT NULL DEFAULT 0,
    skipped         bigint NOT NULL DEFAULT 0,
    last_polled_at  timestamptz,
    last_error      text,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (employee, generation, trigger_name),
    FOREIGN KEY (employee, generation) REFERENCES generations (employee, generation)
);
