-- name: employee_upsert
-- Store an applied spec; returns whether it was new. A deleted employee's name makes a fresh
-- one (created now; its old generations and history stay, numbered before its next Start).
INSERT INTO employees (name, spec, spec_sha256)
VALUES (%(name)s, %(spec)s, %(sha)s)
ON CONFLICT (name) DO UPDATE
    SET spec = EXCLUDED.spec, spec_sha256 = EXCLUDED.spec_sha256, updated_at = now(),
        created_at = CASE WHEN employees.deleted_at IS NULL THEN employees.created_at
                          ELSE now() END,
        deleted_at = NULL
RETURNING (xmax = 0) AS created;

-- name: employee_get
-- One employee with its live generation, if any, and its newest intent.
SELECT e.name, e.spec, e.spec_sha256, e.created_at, e.updated_at,
       g.generation, g.state, g.pause_reason, g.control_revision, g.limits,
       i.id AS intent_id, i.kind AS intent_kind, i.state AS intent_state
FROM employees e
LEFT JOIN generations g ON g.employee = e.name AND g.state <> 'retired'
LEFT JOIN LATERAL (
    SELECT id, kind, state FROM intents WHERE employee = e.name ORDER BY id DESC LIMIT 1
) i ON true
WHERE e.name = %(name)s AND e.deleted_at IS NULL;

-- name: employee_list
-- Every employee with its live generation, if any, and its newest intent.
SELECT e.name, e.spec_sha256, e.updated_at, g.generation, g.state, g.pause_reason,
       g.control_revision, g.limits,
       i.id AS intent_id, i.kind AS intent_kind, i.state AS intent_state
FROM employees e
LEFT JOIN generations g ON g.employee = e.name AND g.state <> 'retired'
LEFT JOIN LATERAL (
    SELECT id, kind, state FROM intents WHERE employee = e.name ORDER BY id DESC LIMIT 1
) i ON true
WHERE e.deleted_at IS NULL
ORDER BY e.name;

-- name: employee_lock
-- Serialize lifecycle changes of one employee (a deleted one has none).
SELECT name, spec, spec_sha256 FROM employees
WHERE name = %(name)s AND deleted_at IS NULL
FOR UPDATE;

-- name: employee_known
-- Whether an employee was ever applied, deleted ones included (their history stays readable).
SELECT name, deleted_at FROM employees WHERE name = %(name)s;

-- name: employee_mark_deleted
-- Delete an employee: a tombstone its history keeps pointing at.
UPDATE employees SET deleted_at = now(), updated_at = now()
WHERE name = %(name)s AND deleted_at IS NULL
RETURNING deleted_at;

-- name: employee_webhook_paths_release
-- A deleted employee's webhook paths become free for any other employee.
DELETE FROM employee_webhook_paths WHERE employee = %(employee)s;

-- name: employee_health_forget
-- A deleted employee is not degraded and its failed turns stop counting: a fresh employee of the
-- same name starts healthy (its window opens now). Only for an employee that has a health row.
UPDATE employee_health
SET degraded_since = NULL, window_from = now(), wake_pending = false,
    cleared_at = CASE WHEN degraded_since IS NULL THEN cleared_at ELSE now() END,
    cleared_by = CASE WHEN degraded_since IS NULL THEN cleared_by ELSE 'owner' END
WHERE employee = %(employee)s;

-- name: employee_deleted_event
-- The operator stream hears of the deletion (live lists drop the employee).
INSERT INTO operator_events (employee, kind, ref, state, detail)
VALUES (%(employee)s, 'employee.deleted', %(employee)s, 'deleted',
        jsonb_build_object('retired_generation', %(generation)s::integer));

-- name: webhook_path_owners
-- Which employees hold these paths: in their applied spec or in a live generation.
SELECT path, employee FROM employee_webhook_paths WHERE path = ANY(%(paths)s)
UNION
SELECT substr(s.source_key, 9) AS path, s.employee
FROM bus_subscriptions s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE g.state <> 'retired' AND s.trigger_kind = 'webhook'
  AND s.source_key = ANY(SELECT 'webhook:' || p FROM unnest(%(paths)s::text[]) p);

-- name: webhook_paths_clear
-- Forget the paths an employee no longer declares.
DELETE FROM employee_webhook_paths WHERE employee = %(employee)s AND NOT (path = ANY(%(paths)s));

-- name: webhook_path_claim
-- Claim one path for an employee.
INSERT INTO employee_webhook_paths (path, employee) VALUES (%(path)s, %(employee)s)
ON CONFLICT (path) DO NOTHING;

-- name: generation_live
-- The live (not retired) generation of an employee, locked.
SELECT employee, generation, state, pause_reason
FROM generations WHERE employee = %(employee)s AND state <> 'retired'
FOR UPDATE;

-- name: generation_next_number
-- The number the next generation takes.
SELECT coalesce(max(generation), 0) + 1 AS generation FROM generations WHERE employee = %(employee)s;

-- name: generation_create
-- A new generation with its frozen snapshot.
INSERT INTO generations (employee, generation, state, spec, spec_sha256)
VALUES (%(employee)s, %(generation)s, 'starting', %(spec)s, %(sha)s);

-- name: generation_set_state
-- Move a generation to another state.
UPDATE generations
SET state = %(state)s,
    pause_reason = %(pause_reason)s,
    running_at = CASE WHEN %(state)s = 'running' THEN coalesce(running_at, now()) ELSE running_at END,
    retired_at = CASE WHEN %(state)s = 'retired' THEN now() ELSE retired_at END
WHERE employee = %(employee)s AND generation = %(generation)s;

-- name: subscription_insert
-- One compiled subscription of a generation.
INSERT INTO bus_subscriptions (employee, generation, trigger_name, trigger_kind, event_types,
    source_key, filter, params, class, thread_by, lane, agent, debounce, on_busy, reply_capable)
VALUES (%(employee)s, %(generation)s, %(trigger_name)s, %(trigger_kind)s, %(event_types)s,
    %(source_key)s, %(filter)s, %(params)s, %(class)s, %(thread_by)s, %(lane)s, %(agent)s,
    %(debounce)s, %(on_busy)s, %(reply_capable)s);

-- name: streams_hold
-- Hold every stream of a generation with a reason (unless held for another reason).
UPDATE bus_streams SET hold_reason = %(reason)s, updated_at = now()
WHERE employee = %(employee)s AND generation = %(generation)s AND hold_reason IS NULL;

-- name: streams_release
-- Release the streams of a generation held for one reason.
UPDATE bus_streams SET hold_reason = NULL, updated_at = now()
WHERE employee = %(employee)s AND generation = %(generation)s AND hold_reason = %(reason)s;

-- name: deliveries_kill_generation
-- A retired generation's unconsumed deliveries become dead(reset): pending, held, and those
-- already signalled to a conversation the Reset cancels (its entity closes without another turn;
-- a turn that still saves while it drains settles its own inputs `done` again).
UPDATE bus_deliveries d SET status = 'dead', reason = 'reset', updated_at = now()
FROM bus_streams s
WHERE d.stream_key = s.stream_key AND s.employee = %(employee)s AND s.generation = %(generation)s
  AND d.status IN ('pending', 'held', 'delivered')
RETURNING d.ingress_id;

-- name: chat_messages_kill_generation
-- The owner's messages among a retired generation's dead(reset) inputs are dead too (never
-- `queued` for ever; a replay queues them again). By employee: its messages' index.
UPDATE chat_messages SET status = 'dead'
WHERE employee = %(employee)s AND ingress_id = ANY(%(ingress_ids)s)
  AND status IN ('queued', 'delivered');

-- name: streams_clear_pending
-- A retired generation's streams have nothing pending.
UPDATE bus_streams SET top_pending_class = NULL, oldest_pending_at = NULL, state = 'retired',
    updated_at = now()
WHERE employee = %(employee)s AND generation = %(generation)s;
