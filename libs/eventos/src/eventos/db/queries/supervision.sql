-- name: generation_bump_revision
-- A control change of the live generation: the next revision, with the block it sets.
UPDATE generations SET control_revision = control_revision + 1
WHERE employee = %(employee)s AND generation = %(generation)s
RETURNING control_revision, state, limits, pause_reason;

-- name: generation_set_limits
-- Replace the live generation's limits block and take the next revision.
UPDATE generations SET limits = %(limits)s, control_revision = control_revision + 1
WHERE employee = %(employee)s AND generation = %(generation)s
RETURNING control_revision, state, limits, pause_reason;

-- name: generation_control
-- A generation's control block, as a supervisor is started from it.
SELECT employee, generation, state, control_revision, limits, pause_reason, spec
FROM generations WHERE employee = %(employee)s AND generation = %(generation)s;

-- name: generations_live_all
-- Every generation that should have a supervisor (re-arm).
SELECT employee, generation, state FROM generations WHERE state <> 'retired'
ORDER BY employee;

-- name: generation_fire_start
-- Start runs once per generation: true only for the first caller.
UPDATE generations SET start_fired_at = now()
WHERE employee = %(employee)s AND generation = %(generation)s AND start_fired_at IS NULL
RETURNING spec;

-- name: intent_insert
-- An owner action that needs Temporal, written with its database change.
INSERT INTO intents (employee, generation, kind, revision, payload)
VALUES (%(employee)s, %(generation)s, %(kind)s, %(revision)s, %(payload)s)
RETURNING id, employee, generation, kind, revision, payload, state, outcome, created_at,
          applied_at;

-- name: intent_get
-- One intent.
SELECT id, employee, generation, kind, revision, payload, state, outcome, attempts, created_at,
       applied_at
FROM intents WHERE id = %(id)s;

-- name: intents_claim
-- The deliverer's next intents: the oldest open one of each employee (instance-wide ones
-- count as one more "employee"), due for an attempt, locked for this transaction. A later
-- intent of an employee waits while an earlier one is open: intents apply in order.
SELECT i.id, i.employee, i.generation, i.kind, i.revision, i.payload, i.attempts,
       extract(epoch FROM now() - i.created_at)::float8 AS age_s
FROM intents i
WHERE i.state = 'applying' AND i.next_attempt_at <= now()
  AND NOT EXISTS (
      SELECT 1 FROM intents o
      WHERE o.state = 'applying' AND o.employee IS NOT DISTINCT FROM i.employee AND o.id < i.id
  )
ORDER BY i.id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: intent_settle
-- An intent applied (or failed for good), with what happened.
UPDATE intents SET state = %(state)s, outcome = %(outcome)s, attempts = attempts + 1,
    applied_at = now()
WHERE id = %(id)s;

-- name: intent_fail_late
-- The generation's newest start or resume intent failed after all: its supervisor's first run
-- found an effect Temporal refuses (a cron Schedule). Said with the cause; none when the row
-- is locked (the deliverer is settling it: the caller tries again, never waits on the lock).
WITH target AS (
    SELECT id FROM intents
    WHERE id = (
        SELECT max(id) FROM intents
        WHERE employee = %(employee)s AND generation = %(generation)s
          AND kind IN ('start', 'resume')
    )
    FOR UPDATE SKIP LOCKED
)
UPDATE intents i SET state = 'failed', outcome = %(outcome)s
FROM target WHERE i.id = target.id
RETURNING i.id;

-- name: intent_retry
-- An attempt did not apply: count it and try again later.
UPDATE intents SET attempts = attempts + 1, outcome = %(outcome)s,
    next_attempt_at = now() + make_interval(secs => %(delay_s)s)
WHERE id = %(id)s;

-- name: supervisor_rebuilds_recent
-- How often a generation's supervisor was rebuilt within the last hour.
SELECT count(*) AS n FROM supervisor_rebuilds
WHERE employee = %(employee)s AND generation = %(generation)s AND at > now() - interval '1 hour';

-- name: supervisor_rebuild_insert
-- A lost supervisor is started again from the database.
INSERT INTO supervisor_rebuilds (employee, generation) VALUES (%(employee)s, %(generation)s);

-- name: generation_entities
-- The entity ids of a generation's streams, with whether they hold unconsumed inputs.
SELECT entity_id, stream_key, delivered_seq > consumed_seq AS holding
FROM bus_streams WHERE employee = %(employee)s AND generation = %(generation)s;

-- name: generation_running_turns
-- A generation's turns still running, with their entity: those still working, and those that
-- saved but still hold their lease (a reply waiting for its approval).
SELECT t.id AS turn_id, s.entity_id
FROM turns t JOIN bus_streams s ON s.stream_key = t.stream_key
WHERE t.employee = %(employee)s AND t.generation = %(generation)s
  AND (t.status = 'running'
       OR t.id IN (SELECT l.turn_id FROM sched_leases l WHERE l.employee = %(employee)s));

-- name: stream_of_conversation
-- A live generation's stream by lane and thread.
SELECT s.stream_key, s.entity_id FROM bus_streams s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE s.employee = %(employee)s AND g.state <> 'retired' AND s.lane = %(lane)s
  AND s.thread = %(thread)s;

-- name: streams_holding
-- Streams of live generations whose entity was sent inputs it has not consumed (re-arm).
SELECT s.stream_key, s.entity_id FROM bus_streams s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE g.state <> 'retired' AND s.delivered_seq > s.consumed_seq;

-- name: stream_redeliver
-- The stream's entity is gone: what it was sent and did not consume is pending again, the
-- window hold is lifted and the relay's ordering columns are recomputed.
WITH back AS (
    UPDATE bus_deliveries SET status = 'pending', updated_at = now()
    WHERE stream_key = %(stream_key)s AND status = 'delivered'
    RETURNING seq
), p AS (
    SELECT min(class) AS top_class, min(created_at) AS oldest FROM bus_deliveries
    WHERE stream_key = %(stream_key)s
      AND (status = 'pending' OR seq IN (SELECT seq FROM back))
)
UPDATE bus_streams s
SET delivered_seq = s.consumed_seq,
    hold_reason = CASE WHEN s.hold_reason = 'window' THEN NULL ELSE s.hold_reason END,
    top_pending_class = p.top_class, oldest_pending_at = p.oldest, updated_at = now()
FROM p
WHERE s.stream_key = %(stream_key)s
RETURNING (SELECT count(*) FROM back) AS redelivered;

-- name: turns_running_all
-- Every turn the database says is running or that holds an admission slot (a turn whose save
-- committed is `done` before its entity gives the slot back); re-arm checks each in Temporal.
SELECT t.id, s.entity_id FROM turns t JOIN bus_streams s ON s.stream_key = t.stream_key
WHERE t.status = 'running' OR EXISTS (SELECT 1 FROM sched_leases l WHERE l.turn_id = t.id);

-- name: outbox_orphaned
-- Queued replies whose turn no longer runs: the send that turn would have made is lost (re-arm).
SELECT o.id, o.kind FROM outbound_messages o JOIN turns t ON t.id = o.turn_id
WHERE o.status = 'queued' AND t.status <> 'running' AND o.retry_requested_at IS NULL
ORDER BY o.id;

-- name: outbound_hand_to_egress
-- An orphaned channel send goes to the egress's own queue of retried sends (sent once).
UPDATE outbound_messages SET retry_requested_at = now(), updated_at = now()
WHERE id = %(id)s AND status = 'queued';
