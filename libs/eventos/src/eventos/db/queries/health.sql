-- name: thread_failure_facts
-- A failed turn's thread, its stream row locked: the hold, the intensity record, and the
-- thread's failed turns within each window since its last release (the turn itself included).
SELECT s.stream_key, s.employee, s.thread, s.hold_reason,
       h.last_failed_turn IS NOT DISTINCT FROM x.id AS counted,
       coalesce(h.backoff_step, 0) AS backoff_step, h.backoff_at, h.backoff_until,
       h.quarantined_at, now() AS now,
       (SELECT count(*) FROM turns t
        WHERE t.stream_key = s.stream_key AND t.status = 'failed'
          AND t.ended_at > now() - make_interval(secs => %(backoff_window_s)s)
          AND t.ended_at > coalesce(h.failures_from, '-infinity')) AS in_backoff_window,
       (SELECT count(*) FROM turns t
        WHERE t.stream_key = s.stream_key AND t.status = 'failed'
          AND t.ended_at > now() - make_interval(secs => %(quarantine_window_s)s)
          AND t.ended_at > coalesce(h.failures_from, '-infinity')) AS in_quarantine_window
FROM turns x
JOIN bus_streams s ON s.stream_key = x.stream_key
LEFT JOIN thread_health h ON h.stream_key = s.stream_key
WHERE x.id = %(turn_id)s AND x.status = 'failed'
FOR UPDATE OF s;

-- name: thread_failure_counted
-- The failed turn is counted on its thread's record, with the backoff or quarantine it brought.
INSERT INTO thread_health (stream_key, employee, last_failed_turn, backoff_step, backoff_at,
    backoff_until, quarantined_at)
VALUES (%(stream_key)s, %(employee)s, %(turn_id)s, %(backoff_step)s, %(backoff_at)s,
    %(backoff_until)s, %(quarantined_at)s)
ON CONFLICT (stream_key) DO UPDATE
    SET last_failed_turn = EXCLUDED.last_failed_turn, backoff_step = EXCLUDED.backoff_step,
        backoff_at = EXCLUDED.backoff_at, backoff_until = EXCLUDED.backoff_until,
        quarantined_at = EXCLUDED.quarantined_at;

-- name: thread_hold
-- Hold a thread's stream for its restart intensity: `quarantined` over any other hold (only a
-- release lifts it); `backoff` until `until` over the relay's own holds, not over a pause or a
-- quarantine (admission still refuses its turns until then).
UPDATE bus_streams SET hold_reason = %(hold)s, hold_until = %(until)s, updated_at = now()
WHERE stream_key = %(stream_key)s
  AND (%(hold)s::text = 'quarantined' OR hold_reason IS NULL
       OR hold_reason IN ('window', 'budget', 'degraded', 'backoff'));

-- name: thread_unquarantine
-- The quarantine is lifted: the stream goes back to the relay (held `paused` while its
-- generation is paused).
UPDATE bus_streams s
SET hold_reason = CASE WHEN g.state = 'paused' THEN 'paused' END, hold_until = NULL,
    updated_at = now()
FROM generations g
WHERE s.stream_key = %(stream_key)s AND s.hold_reason = 'quarantined'
  AND g.employee = s.employee AND g.generation = s.generation;

-- name: thread_health_release
-- A released thread starts a new failure window, backs off from the first step again, and its
-- entity is to be woken; the inputs it holds (pending in the bus or sent to its entity).
UPDATE thread_health h
SET quarantined_at = NULL, backoff_step = 0, backoff_until = NULL, failures_from = now(),
    released_at = now(), wake_pending = true
WHERE h.stream_key = %(stream_key)s AND h.quarantined_at IS NOT NULL
RETURNING (SELECT count(*) FROM bus_deliveries d
           WHERE d.stream_key = h.stream_key
             AND d.status IN ('pending', 'held', 'delivered')) AS held;

-- name: thread_backoffs_lift
-- Backoffs that ended: their streams go back to the relay.
UPDATE bus_streams SET hold_reason = NULL, hold_until = NULL, updated_at = now()
WHERE hold_reason = 'backoff' AND hold_until <= %(now)s
RETURNING stream_key;

-- name: thread_wakes_take
-- Released threads whose entities are to be woken (each taken once).
UPDATE thread_health h SET wake_pending = false
FROM bus_streams s
WHERE h.wake_pending AND s.stream_key = h.stream_key
RETURNING s.entity_id;

-- name: employee_wakes_take
-- The entities holding inputs of employees that stopped being degraded (each taken once).
WITH taken AS (
    UPDATE employee_health SET wake_pending = false WHERE wake_pending RETURNING employee
)
SELECT s.entity_id FROM bus_streams s
JOIN taken t ON t.employee = s.employee
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE g.state <> 'retired' AND s.delivered_seq > s.consumed_seq;

-- name: employees_health_facts
-- Every employee with turns ended in the window (after the owner's last clear), a quarantined
-- thread of a live generation, or degraded now: its failed and ended turns, its quarantined
-- threads (quarantined after that clear) and its degraded state.
WITH ended AS (
    SELECT t.employee, count(*) FILTER (WHERE t.status = 'failed') AS failed, count(*) AS n
    FROM turns t LEFT JOIN employee_health h ON h.employee = t.employee
    WHERE t.status IN ('done', 'failed') AND t.ended_at > %(since)s AND t.ended_at <= %(now)s
      AND t.ended_at > coalesce(h.window_from, '-infinity')
    GROUP BY t.employee
), held AS (
    SELECT th.employee, count(*) AS quarantined
    FROM thread_health th
    JOIN bus_streams s ON s.stream_key = th.stream_key
    JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
    LEFT JOIN employee_health h ON h.employee = th.employee
    WHERE th.quarantined_at IS NOT NULL AND g.state <> 'retired'
      AND th.quarantined_at > coalesce(h.window_from, '-infinity')
    GROUP BY th.employee
), who AS (
    SELECT employee FROM ended
    UNION SELECT employee FROM held
    UNION SELECT employee FROM employee_health WHERE degraded_since IS NOT NULL
)
SELECT w.employee, coalesce(e.failed, 0) AS failed, coalesce(e.n, 0) AS ended,
       coalesce(q.quarantined, 0) AS quarantined, h.degraded_since
FROM who w
LEFT JOIN ended e ON e.employee = w.employee
LEFT JOIN held q ON q.employee = w.employee
LEFT JOIN employee_health h ON h.employee = w.employee
ORDER BY w.employee
LIMIT %(limit)s;

-- name: employee_degrade
-- The employee becomes degraded (a no-op when it already is); its row, when it became so now.
INSERT INTO employee_health (employee, degraded_since, reason)
VALUES (%(employee)s, %(now)s, %(reason)s)
ON CONFLICT (employee) DO UPDATE
    SET degraded_since = EXCLUDED.degraded_since, reason = EXCLUDED.reason
    WHERE employee_health.degraded_since IS NULL
RETURNING employee;

-- name: employee_health_lock
-- An employee's health row, locked (an owner's clear and the pass take turns).
SELECT employee, degraded_since, reason FROM employee_health
WHERE employee = %(employee)s FOR UPDATE;

-- name: employee_recover
-- The employee is no longer degraded: its entities are to be woken; cleared by the owner, its
-- window starts again (what failed so far no longer counts).
UPDATE employee_health
SET degraded_since = NULL, cleared_at = %(now)s, cleared_by = %(by)s::text, wake_pending = true,
    window_from = CASE WHEN %(by)s::text = 'owner' THEN %(now)s ELSE window_from END
WHERE employee = %(employee)s AND degraded_since IS NOT NULL
RETURNING employee;

-- name: streams_release_degraded
-- Background streams held while the employee was degraded go back to the relay.
UPDATE bus_streams SET hold_reason = NULL, updated_at = now()
WHERE employee = %(employee)s AND hold_reason = 'degraded';

-- name: stream_hold_degraded
-- Hold a stream whose pending input is all background work while its employee is degraded.
UPDATE bus_streams s SET hold_reason = 'degraded', updated_at = now()
WHERE s.stream_key = %(stream_key)s AND s.hold_reason IS NULL
  AND EXISTS (SELECT 1 FROM employee_health h
              WHERE h.employee = s.employee AND h.degraded_since IS NOT NULL);

-- name: streams_release_not_degraded
-- `degraded` holds of employees no longer degraded (one set while a recovery committed).
UPDATE bus_streams s SET hold_reason = NULL, updated_at = now()
WHERE s.hold_reason = 'degraded'
  AND NOT EXISTS (SELECT 1 FROM employee_health h
                  WHERE h.employee = s.employee AND h.degraded_since IS NOT NULL)
RETURNING s.stream_key;

-- name: employee_health_get
-- An employee's degraded state, for the owner API.
SELECT degraded_since, reason FROM employee_health
WHERE employee = %(employee)s AND degraded_since IS NOT NULL;

-- name: health_counts
-- Quarantined threads of live generations and degraded employees now (the relay's gauges).
SELECT (SELECT count(*) FROM thread_health th
        JOIN bus_streams s ON s.stream_key = th.stream_key
        JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
        WHERE th.quarantined_at IS NOT NULL AND g.state <> 'retired') AS quarantined,
       (SELECT count(*) FROM employee_health WHERE degraded_since IS NOT NULL) AS degraded;

-- name: health_item_raise
-- Raise a watchdog's item, or refresh the open one (a condition that goes on is not a repeat:
-- its count stays); `raised` when it is new. An item about a stream (`ref` its key) on a user's
-- chat thread is that user's too, and so is one about a turn (`ref` its id) on such a thread.
INSERT INTO attention_items (employee, kind, severity, ref, detail, audience)
VALUES (%(employee)s, %(kind)s, %(severity)s, %(ref)s, %(detail)s, (
    SELECT u.name FROM users u
    WHERE u.thread IN (SELECT s.thread FROM bus_streams s WHERE s.stream_key = %(ref)s
                       UNION ALL SELECT t.thread FROM turns t WHERE t.id = %(ref)s)
    LIMIT 1))
ON CONFLICT (kind, ref) WHERE state = 'open' DO UPDATE
    SET last_seen = now(), detail = EXCLUDED.detail
RETURNING xmax = 0 AS raised;

-- name: health_items_resolve
-- The items of a watchdog not resolved yet whose cause is gone (their refs are not among those
-- it raised now).
UPDATE attention_items SET state = 'resolved', last_seen = now(), resolved_at = now()
WHERE kind = %(kind)s AND state <> 'resolved' AND NOT (ref = ANY(%(refs)s::text[]))
RETURNING id;

-- name: router_oldest_accepted
-- The oldest ingress row the router has not settled yet.
SELECT min(received_at) AS oldest FROM bus_ingress WHERE status = 'accepted';

-- name: streams_window_idle
-- Streams whose window is full (the relay holds them `window`) while their entity runs no turn
-- and asks for no slot, with nothing in between since `idle_before` (a credit leak). A paused
-- generation, a budget past normal and a degraded employee hold inputs there on purpose.
SELECT s.stream_key, s.employee, s.delivered_seq - s.consumed_seq AS unconsumed
FROM bus_streams s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
LEFT JOIN employee_budgets b ON b.employee = s.employee
LEFT JOIN employee_health h ON h.employee = s.employee
WHERE s.hold_reason = 'window' AND g.state = 'running'
  AND coalesce(b.state, 'normal') = 'normal' AND h.degraded_since IS NULL
  AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.stream_key = s.stream_key AND t.status = 'running')
  AND NOT EXISTS (SELECT 1 FROM sched_waiters w WHERE w.stream_key = s.stream_key)
  AND coalesce((SELECT max(t.ended_at) FROM turns t WHERE t.stream_key = s.stream_key),
               '-infinity') < %(idle_before)s
  AND NOT EXISTS (SELECT 1 FROM bus_deliveries d
                  WHERE d.stream_key = s.stream_key AND d.status = 'delivered'
                    AND d.updated_at >= %(idle_before)s)
ORDER BY s.stream_key
LIMIT %(limit)s;

-- name: intents_retrying
-- Intents still applying after many attempts (Temporal refuses, or an effect keeps failing).
SELECT id, coalesce(employee, %(instance)s) AS employee, kind, attempts, outcome
FROM intents WHERE state = 'applying' AND attempts >= %(attempts)s
ORDER BY id LIMIT %(limit)s;

-- name: turns_stuck
-- Running turns holding a slot (an active lease) with no step progress since `quiet_before`:
-- no completed LLM step since then, nor a start or a slot (re)gained (a turn back from a
-- suspension or a park counts from its new grant). Suspended and parked turns hold no slot.
SELECT t.id, t.employee, t.class,
       extract(epoch FROM %(now)s - greatest(coalesce(t.last_step_at, t.started_at),
                                             l.granted_at)) AS quiet_s
FROM turns t
JOIN sched_leases l ON l.turn_id = t.id AND l.state = 'active'
WHERE t.status = 'running'
  AND greatest(coalesce(t.last_step_at, t.started_at), l.granted_at) < %(quiet_before)s
ORDER BY t.started_at
LIMIT %(limit)s;

-- name: sends_retrying
-- Outbox rows still unsent after many claims (the provider keeps deferring or failing them).
SELECT id, employee, kind, attempts, status FROM outbound_messages
WHERE status IN ('queued', 'sending') AND attempts >= %(attempts)s
ORDER BY id LIMIT %(limit)s;

-- name: workflow_employees
-- The employee each workflow id belongs to, where the database knows it: an entity (its
-- stream), a turn, an approval, or a generation's supervisor, poll or cron tick (by id prefix);
-- NULL for any other.
SELECT w.id, coalesce(s.employee, t.employee, a.employee, g.employee) AS employee
FROM unnest(%(ids)s::text[]) AS w(id)
LEFT JOIN LATERAL (SELECT employee FROM bus_streams WHERE entity_id = w.id LIMIT 1) s ON true
LEFT JOIN turns t ON t.id = w.id
LEFT JOIN approvals a ON starts_with(w.id, 'approval-') AND a.id = substr(w.id, 10)
LEFT JOIN LATERAL (
    SELECT employee FROM generations
    WHERE w.id = 'emp-' || employee || '-g' || generation
       OR starts_with(w.id, 'poll-' || employee || '-g' || generation || '-')
       OR starts_with(w.id, 'cron-' || employee || '-g' || generation || '-')
    ORDER BY length(employee) DESC LIMIT 1) g ON true;
