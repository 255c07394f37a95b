-- Supervision (SPEC §12, issue 16): restart intensity per thread (backoff, quarantine), the
-- `degraded` employee, and the indexes the watchdogs read.

-- A timed hold ends at `hold_until` (`backoff`; NULL for every other hold). The relay gates
-- on `hold_reason`; the why-waiting view reads both.
ALTER TABLE bus_streams ADD COLUMN hold_until timestamptz;
CREATE INDEX bus_streams_held ON bus_streams (hold_reason, hold_until)
    WHERE hold_reason IS NOT NULL;

-- A thread's restart intensity, counted on its failed turns (`turns.status = 'failed'`).
CREATE TABLE thread_health (
    stream_key        text PRIMARY KEY REFERENCES bus_streams (stream_key),
    employee          text NOT NULL,
    last_failed_turn  text,  -- the last failed turn counted (counting it again is a no-op)
    backoff_step      smallint NOT NULL DEFAULT 0,  -- backoffs in a row: 1, 5, then 30 minutes
    backoff_at        timestamptz,  -- when the last backoff began
    backoff_until     timestamptz,  -- admission refuses a turn before it
    quarantined_at    timestamptz,  -- admission refuses every turn until the owner releases it
    failures_from     timestamptz,  -- failed turns before this do not count (the last release)
    released_at       timestamptz,
    wake_pending      boolean NOT NULL DEFAULT false  -- released: the relay wakes its entity
);
-- The relay's pass reads the quarantined threads and the entities to wake, every few seconds.
CREATE INDEX thread_health_quarantined ON thread_health (employee)
    WHERE quarantined_at IS NOT NULL;
CREATE INDEX thread_health_wake ON thread_health (stream_key) WHERE wake_pending;

-- An employee's health: `degraded` while too many turns fail (or 3 threads are quarantined).
CREATE TABLE employee_health (
    employee        text PRIMARY KEY,
    degraded_since  timestamptz,  -- NULL: not degraded
    reason          text,
    window_from     timestamptz,  -- turns before this do not count (the owner's last clear)
    cleared_at      timestamptz,
    cleared_by      text,  -- `recovered` (the window recovered) or `owner`
    wake_pending    boolean NOT NULL DEFAULT false  -- cleared: the relay wakes its entities
);

-- Failed turns per thread in a window, turns per employee in a window, a stream's turns.
CREATE INDEX turns_stream_ended ON turns (stream_key, ended_at);
CREATE INDEX turns_ended ON turns (ended_at) WHERE status IN ('done', 'failed');
