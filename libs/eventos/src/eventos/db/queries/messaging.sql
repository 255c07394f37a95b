-- name: ipc_peer_running
-- Another employee of the instance a message may go to: its live generation, if running.
SELECT g.employee, g.generation, g.state FROM generations g
WHERE g.employee = %(employee)s AND g.state <> 'retired';

-- name: ipc_pending_for_target
-- The target's ipc inputs not yet consumed: unrouted rows of `ipc:<target>` and undelivered
-- or unconsumed deliveries of its implicit ipc subscription (SPEC §15: 500 per target).
SELECT (SELECT count(*) FROM bus_ingress
        WHERE source_key = %(source_key)s AND status = 'accepted')
     + (SELECT count(*) FROM bus_deliveries d JOIN bus_subscriptions s ON s.id = d.subscription_id
        WHERE s.source_key = %(source_key)s AND d.status IN ('pending', 'held', 'delivered'))
       AS pending;

-- name: ipc_open_tasks_of
-- How many tasks an employee has delegated that are still open (SPEC §15: 200).
SELECT count(*) AS open FROM ipc_tasks WHERE from_employee = %(employee)s AND status = 'open';

-- name: ipc_task_insert
-- A delegated task; committed with its inbox append, in the delegating call's transaction.
INSERT INTO ipc_tasks (id, from_employee, from_generation, to_employee, task, reply_to,
    chain_id, hop, path, deadline_at, created_at, to_thread)
VALUES (%(id)s, %(from_employee)s, %(from_generation)s, %(to_employee)s, %(task)s,
    %(reply_to)s, %(chain_id)s, %(hop)s, %(path)s, %(deadline_at)s, %(now)s, %(to_thread)s);

-- name: ipc_task_get
-- One task, by id.
SELECT id, from_employee, from_generation, to_employee, task, status, reply_to, chain_id,
       hop, path, deadline_at, result, created_at, completed_at, to_thread
FROM ipc_tasks WHERE id = %(id)s;

-- name: ipc_task_complete
-- The assignee's result, from the thread the task landed in, by compare-and-swap on `open`
-- (a second completion finds none).
UPDATE ipc_tasks SET status = 'done', result = %(result)s, completed_at = %(now)s
WHERE id = %(id)s AND to_employee = %(employee)s AND to_thread = %(thread)s
  AND status = 'open'
RETURNING id, from_employee, to_employee, reply_to, chain_id, hop, path;

-- name: ipc_task_time_out
-- A task's deadline alarm fired: an open task of that delegator moves to `timed_out` by
-- compare-and-swap (a result that won the race is left alone), in `fire_due`'s transaction.
UPDATE ipc_tasks SET status = 'timed_out', completed_at = %(now)s
WHERE id = %(id)s AND from_employee = %(employee)s AND status = 'open'
RETURNING id, from_employee, to_employee, reply_to, chain_id, hop, path, deadline_at;

-- name: ipc_task_cancel
-- A task whose wake the storm guards cut as a loop is `cancelled` with the reason, in the
-- routing transaction (it would otherwise hold a slot of the 200); its deadline alarm goes too.
UPDATE ipc_tasks SET status = 'cancelled', result = %(reason)s, completed_at = %(now)s
WHERE id = %(id)s AND status = 'open'
RETURNING from_employee;

-- name: ipc_tasks_cancel_generation
-- Reset: the retired generation's open delegations are cancelled (their results would land in
-- a retired generation; they no longer count toward the delegator's 200).
UPDATE ipc_tasks SET status = 'cancelled', result = 'the delegating generation was reset',
    completed_at = now()
WHERE from_employee = %(employee)s AND from_generation = %(generation)s AND status = 'open';

-- name: ipc_undelivered_expire
-- SPEC §15: messages and tasks from other employees still not handed to their entity (held by
-- a pause, a budget, a degraded employee) since before `before` are `expired` with the reason;
-- at most `limit` a pass, oldest first (bus_deliveries_ipc_waiting). Rows another transaction
-- holds are left for the next pass.
WITH doomed AS (
    SELECT d.id FROM bus_deliveries d
    JOIN bus_streams s ON s.stream_key = d.stream_key
    WHERE d.status IN ('pending', 'held')
      AND d.type IN ('eventos.ipc.message', 'eventos.ipc.task')
      AND d.ingress_received_at < %(before)s AND d.seq > s.delivered_seq
    ORDER BY d.ingress_received_at
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE bus_deliveries d SET status = 'expired', reason = %(reason)s, updated_at = now()
FROM doomed
WHERE d.id = doomed.id
RETURNING d.type, d.payload, d.chain_id, d.hop, d.ingress_received_at,
          split_part(d.stream_key, '/', 1) AS target;

-- name: ipc_task_expire
-- A task whose wake expired undelivered: an open task moves to `expired` by compare-and-swap
-- (one settled meanwhile is left alone), in the staleness sweep's transaction.
UPDATE ipc_tasks SET status = 'expired', result = %(reason)s, completed_at = %(now)s
WHERE id = %(id)s AND status = 'open'
RETURNING id, from_employee, to_employee, reply_to, chain_id, hop, path;
