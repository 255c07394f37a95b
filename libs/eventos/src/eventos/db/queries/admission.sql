-- name: sched_lock
-- Admissions and releases of the whole instance take turns (capacity is shared).
SELECT pg_advisory_xact_lock(hashtextextended('eventos.sched', 0));

-- name: admission_gate
-- The asking generation's state and the employee's budget state; the thread's restart
-- intensity (quarantined, backoff left) and whether the employee is degraded (eventos.health).
SELECT g.state AS generation_state, coalesce(b.state, 'normal') AS budget_state,
       th.quarantined_at IS NOT NULL AS quarantined,
       extract(epoch FROM th.backoff_until - now())::float8 AS backoff_left_s,
       eh.degraded_since IS NOT NULL AS degraded
FROM (SELECT %(employee)s::text AS employee) e
LEFT JOIN generations g ON g.employee = e.employee AND g.generation = %(generation)s
LEFT JOIN employee_budgets b ON b.employee = e.employee
LEFT JOIN thread_health th ON th.stream_key = %(stream_key)s
LEFT JOIN employee_health eh ON eh.employee = e.employee;

-- name: reserved_held
-- Whether the employee's reserved owner slot is taken (read under the lock).
SELECT EXISTS (SELECT 1 FROM sched_leases
               WHERE employee = %(employee)s AND reserved AND state = 'active') AS held;

-- name: waiter_upsert
-- The entity waits for a slot (or asks again: it keeps its place in the queue); whether a slot
-- is kept for it (an offer not lapsed). `takes_held`: the relay holds its inputs meanwhile.
INSERT INTO sched_waiters (stream_key, employee, generation, agent, thread, class, workflow_id,
    turn_id, takes_held)
VALUES (%(stream_key)s, %(employee)s, %(generation)s, %(agent)s, %(thread)s, %(class)s,
    %(workflow_id)s, %(turn_id)s, %(takes_held)s)
ON CONFLICT (stream_key) DO UPDATE
    SET generation = EXCLUDED.generation, agent = EXCLUDED.agent, thread = EXCLUDED.thread,
        class = EXCLUDED.class, workflow_id = EXCLUDED.workflow_id, turn_id = EXCLUDED.turn_id,
        takes_held = EXCLUDED.takes_held, asked_at = now()
RETURNING offered_at >= now() - make_interval(secs => %(offer_ttl_s)s) AS offered;

-- name: waiter_delete
-- The entity no longer waits (granted, or refused by a gate); how long it waited.
DELETE FROM sched_waiters WHERE stream_key = %(stream_key)s
RETURNING extract(epoch FROM now() - requested_at) AS waited_s;

-- name: waiters_expire
-- An offer not taken within its time goes back to the pool; a waiter that stopped asking is
-- gone (its entity closed or was lost).
WITH lapsed AS (
    UPDATE sched_waiters SET offered_at = NULL
    WHERE offered_at < now() - make_interval(secs => %(offer_ttl_s)s)
)
DELETE FROM sched_waiters WHERE asked_at < now() - make_interval(secs => %(stale_s)s);

-- name: sched_load
-- Slots held now by class and employee: active leases (reserved owner slots count toward
-- nothing) and slots kept for offered waiters.
SELECT class, employee, count(*) AS n FROM (
    SELECT class, employee FROM sched_leases WHERE state = 'active' AND NOT reserved
    UNION ALL
    SELECT class, employee FROM sched_waiters WHERE offered_at IS NOT NULL
) held
GROUP BY class, employee;

-- name: sched_admitted
-- Turns admitted per class in the share window (floors are shares of admitted turns).
SELECT class, count(*) AS n FROM turns
WHERE started_at > now() - make_interval(secs => %(window_s)s)
GROUP BY class;

-- name: waiters_list
-- The waiting entities with when their employee was last served in their class (the console's
-- reading of the queue; admission reads `waiters_next`).
SELECT w.stream_key, w.employee, w.class, w.requested_at, w.offered_at, w.workflow_id,
       w.takes_held, r.served_at
FROM sched_waiters w
LEFT JOIN sched_rounds r ON r.class = w.class AND r.employee = w.employee
ORDER BY w.requested_at
LIMIT %(limit)s;

-- name: waiters_next
-- The waiters a pass over `slots` free slots may offer them to, in each class of `classes`: the
-- first `slots` employees in turn (served longest ago first, never served first, then whose
-- oldest waiter asked first) that are not `capped`, each with its `each` oldest waiters not
-- offered a slot yet. Index reads: none of this grows with the waiters.
SELECT w.stream_key, w.employee, w.class, w.requested_at, w.workflow_id, e.served_at
FROM unnest(%(classes)s::smallint[]) AS k(class)
CROSS JOIN LATERAL (
    SELECT r.employee, r.served_at FROM sched_rounds r
    WHERE r.class = k.class AND r.head_at IS NOT NULL AND r.employee <> ALL(%(capped)s::text[])
    ORDER BY r.served_at NULLS FIRST, r.head_at, r.head_key
    LIMIT %(slots)s
) e
CROSS JOIN LATERAL (
    SELECT w.stream_key, w.employee, w.class, w.requested_at, w.workflow_id FROM sched_waiters w
    WHERE w.class = k.class AND w.employee = e.employee AND w.offered_at IS NULL
    ORDER BY w.requested_at, w.stream_key
    LIMIT %(each)s
) w;

-- name: waiters_offer
-- Keep a slot for each of these waiters until they ask again.
UPDATE sched_waiters SET offered_at = now()
WHERE stream_key = ANY(%(stream_keys)s)
RETURNING workflow_id;

-- name: round_served
-- Round-robin memory: the employee was served in this class now.
INSERT INTO sched_rounds (class, employee, served_at) VALUES (%(class)s, %(employee)s, now())
ON CONFLICT (class, employee) DO UPDATE SET served_at = now();

-- name: turn_granted_to_ask
-- The running turn an ask was granted before (its answer was lost), with its slot.
SELECT t.id, t.n, l.reserved FROM turns t JOIN sched_leases l ON l.turn_id = t.id
WHERE t.ask = %(ask)s AND t.status = 'running';

-- name: lease_grant
-- The turn holds a slot.
INSERT INTO sched_leases (turn_id, employee, class, reserved, stream_key)
VALUES (%(id)s, %(employee)s, %(class)s, %(reserved)s, %(stream_key)s);

-- name: lease_resume
-- A suspended turn holds its slot again (same turn id); the time it held none is not counted
-- toward its slowness.
WITH resumed AS (
    UPDATE sched_leases l
    SET state = 'active', class = %(class)s, reserved = %(reserved)s, suspended_reason = NULL,
        suspended_at = NULL, granted_at = now()
    FROM (SELECT turn_id, suspended_at FROM sched_leases WHERE turn_id = %(id)s FOR UPDATE) old
    WHERE l.turn_id = old.turn_id
    RETURNING old.suspended_at
)
UPDATE turns t
SET held_s = t.held_s + coalesce((SELECT extract(epoch FROM now() - suspended_at) FROM resumed), 0)
WHERE t.id = %(id)s;

-- name: slot_release
-- The turn gives its slot back.
DELETE FROM sched_leases WHERE turn_id = %(turn_id)s;

-- name: lease_upgrade
-- Priority inheritance: the turn's lease moves up to a higher class (a lower number).
UPDATE sched_leases SET class = %(class)s WHERE turn_id = %(turn_id)s AND class > %(class)s;

-- name: lease_suspend
-- The turn stops holding a slot until it is released (same turn id when it resumes).
UPDATE sched_leases SET state = 'suspended', suspended_reason = %(reason)s, suspended_at = now()
WHERE turn_id = %(turn_id)s AND state = 'active'
RETURNING employee;

-- name: turn_parked
-- The turn parked: since when (its first park until a step completes again).
UPDATE turns SET parked_at = coalesce(parked_at, now()) WHERE id = %(turn_id)s;

-- name: turn_parked_for
-- How long a suspended turn asking again has been parked (NULL: not parked).
SELECT extract(epoch FROM now() - parked_at) AS parked_s FROM turns WHERE id = %(turn_id)s;

-- name: leases_suspended
-- The employee's suspended turns, with the class each runs at.
SELECT turn_id, class FROM sched_leases
WHERE employee = %(employee)s AND state = 'suspended';
