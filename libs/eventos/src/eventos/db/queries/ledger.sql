-- name: budget_source
-- The live generation's daily limit (the owner's limits block wins over the spec) and zone.
SELECT g.generation, g.state, g.pause_reason,
       coalesce((g.limits ->> 'daily_usd')::numeric,
                (g.spec -> 'spec' -> 'budget' ->> 'daily_usd')::numeric) AS daily_usd,
       coalesce(g.spec -> 'spec' ->> 'timezone', 'UTC') AS timezone
FROM generations g
WHERE g.employee = %(employee)s AND g.state <> 'retired'
ORDER BY g.generation DESC LIMIT 1;

-- name: budget_lock
-- The employee's budget row, locked for the rest of the transaction.
SELECT employee, daily_usd, timezone, offset_s, period_start, period_end, state
FROM employee_budgets WHERE employee = %(employee)s FOR UPDATE;

-- name: budget_insert
-- The employee's first budget period.
INSERT INTO employee_budgets (employee, daily_usd, timezone, offset_s, period_start, period_end)
VALUES (%(employee)s, %(daily_usd)s, %(timezone)s, %(offset_s)s, %(period_start)s, %(period_end)s)
ON CONFLICT (employee) DO NOTHING;

-- name: budget_update
-- The limit, the period and the state of an employee's budget.
UPDATE employee_budgets
SET daily_usd = %(daily_usd)s, timezone = %(timezone)s, period_start = %(period_start)s,
    period_end = %(period_end)s, state = %(state)s, updated_at = now()
WHERE employee = %(employee)s;

-- name: spend_open
-- The period's spend row (created on first use).
INSERT INTO employee_spend (employee, period_start) VALUES (%(employee)s, %(period_start)s)
ON CONFLICT (employee, period_start) DO UPDATE SET employee = EXCLUDED.employee
RETURNING reserved_usd, spent_usd;

-- name: spend_event_get
-- A reservation already made under this key (a retried call counts once).
SELECT state FROM spend_events WHERE key = %(key)s;

-- name: spend_event_insert
-- Reserve the step's upper estimate.
INSERT INTO spend_events (key, employee, period_start, turn_id, class, model, estimate_usd)
VALUES (%(key)s, %(employee)s, %(period_start)s, %(turn_id)s, %(class)s, %(model)s,
    %(estimate)s);

-- name: spend_reserve
-- Count the reservation in the period.
UPDATE employee_spend SET reserved_usd = reserved_usd + %(estimate)s
WHERE employee = %(employee)s AND period_start = %(period_start)s;

-- name: spend_event_settle
-- The actual cost replaces the estimate (once: only a reserved event settles).
UPDATE spend_events
SET state = %(state)s, actual_usd = %(actual)s, input_tokens = %(input_tokens)s,
    output_tokens = %(output_tokens)s, settled_at = now()
WHERE key = %(key)s AND state = 'reserved'
RETURNING employee, period_start, estimate_usd, turn_id;

-- name: turn_stepped
-- The turn completed a step (the watchdog's 24-hour backstop counts from the last one).
UPDATE turns SET last_step_at = now(), parked_at = NULL WHERE id = %(turn_id)s;

-- name: spend_settle
-- Move the settled event from reserved to spent.
UPDATE employee_spend
SET reserved_usd = greatest(reserved_usd - %(estimate)s, 0), spent_usd = spent_usd + %(actual)s
WHERE employee = %(employee)s AND period_start = %(period_start)s;

-- name: streams_release_budget
-- The budget is normal again: the employee's streams held for it go back to the relay.
UPDATE bus_streams SET hold_reason = NULL, updated_at = now()
WHERE employee = %(employee)s AND hold_reason = 'budget';

-- name: attention_resolve
-- Close an open or acknowledged attention item (its cause went away).
UPDATE attention_items SET state = 'resolved', last_seen = now(), resolved_at = now()
WHERE kind = %(kind)s AND ref = %(ref)s AND state IN ('open', 'acked');

-- name: chat_notice_insert
-- A notice in the owner's chat (once per dedupe key).
INSERT INTO chat_events (employee, session, kind, turn_id, dedupe_key, text)
VALUES (%(employee)s, %(session)s, 'notice', '', %(dedupe_key)s, %(text)s)
ON CONFLICT (dedupe_key) DO NOTHING;

-- name: user_spend
-- A user's spend with one employee in its budget's current period: what its chat's turns
-- spent or hold reserved, the employee's daily limit and the period's end (none before the
-- budget's first use).
SELECT coalesce((
        SELECT sum(CASE e.state WHEN 'reserved' THEN e.estimate_usd ELSE e.actual_usd END)
        FROM spend_events e JOIN turns t ON t.id = e.turn_id
        WHERE e.employee = b.employee AND e.period_start = b.period_start
          AND t.thread = %(thread)s), 0) AS used_usd,
    b.daily_usd, b.period_end
FROM employee_budgets b WHERE b.employee = %(employee)s;

-- name: user_of_thread
-- The user whose owner chat a thread is (its own cap, if the admin set one).
SELECT name, daily_usd FROM users WHERE thread = %(thread)s;

-- name: turn_thread
-- The thread a turn runs on (is it a user's chat?).
SELECT thread FROM turns WHERE id = %(turn_id)s;
