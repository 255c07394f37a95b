-- name: alarms_lock_employee
-- One alarm writer per employee at a time (the 500 cap is counted, then a row inserted).
SELECT pg_advisory_xact_lock(hashtextextended('eventos.alarms:' || %(employee)s, 0));

-- name: alarms_count_scheduled
-- Scheduled alarms of a generation of one kind (the cap of SPEC §15).
SELECT count(*) AS n FROM alarms
WHERE employee = %(employee)s AND generation = %(generation)s AND kind = %(kind)s
  AND status = 'scheduled';

-- name: alarm_insert
-- A new alarm; a row with the same id (the same call, or the same deadline ref) is kept as is.
INSERT INTO alarms (id, employee, generation, kind, ref, lane, thread, route, agent, text,
    payload, due_at, if_late, skip_after_s, cancel_on, repeat, chain_id, hop, path, causation_id)
VALUES (%(id)s, %(employee)s, %(generation)s, %(kind)s, %(ref)s, %(lane)s, %(thread)s,
    %(route)s, %(agent)s, %(text)s, %(payload)s, %(due_at)s, %(if_late)s, %(skip_after_s)s,
    %(cancel_on)s, %(repeat)s, %(chain_id)s, %(hop)s, %(path)s, %(causation_id)s)
ON CONFLICT (id) DO NOTHING;

-- name: alarm_get
-- One alarm set in a conversation (lane, thread) of a generation: a turn sees only its own
-- conversation's alarms (SPEC §16 EG3, EG17).
SELECT id, kind, text, due_at, status, repeat, occurrence FROM alarms
WHERE id = %(id)s AND employee = %(employee)s AND generation = %(generation)s
  AND lane = %(lane)s AND thread = %(thread)s;

-- name: alarm_cancel
-- Cancel a scheduled alarm set in a conversation of a generation (compare-and-swap on its
-- status).
UPDATE alarms SET status = 'cancelled', settled_at = now()
WHERE id = %(id)s AND employee = %(employee)s AND generation = %(generation)s
  AND lane = %(lane)s AND thread = %(thread)s AND kind = %(kind)s AND status = 'scheduled'
RETURNING id, status;

-- name: alarms_cancel_by_ref
-- Cancel the scheduled alarms of one kind and ref (a task completed before its deadline). A row
-- fire_due holds is skipped, not waited for: that transaction may be waiting for the owner's row
-- this one holds (a deadlock), and it settles the alarm itself (a hook finds the owner settled).
UPDATE alarms SET status = 'cancelled', settled_at = now()
WHERE id IN (SELECT id FROM alarms
             WHERE employee = %(employee)s AND kind = %(kind)s AND ref = %(ref)s
               AND status = 'scheduled'
             FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: alarms_list
-- The alarms a conversation (lane, thread) of a generation set that its model may read: every
-- scheduled one, then the ones settled in the last day, soonest first.
SELECT id, text, due_at, status, repeat, (count(*) OVER ())::integer AS total FROM alarms
WHERE employee = %(employee)s AND generation = %(generation)s AND lane = %(lane)s
  AND thread = %(thread)s AND kind = 'alarm'
  AND (status = 'scheduled' OR settled_at > now() - interval '1 day')
ORDER BY status <> 'scheduled', due_at, id
LIMIT %(limit)s;

-- name: alarms_cancel_follow_ups
-- An inbound message reached a thread: its follow-ups are cancelled (in the routing
-- transaction, so the supervisor finds nothing due).
UPDATE alarms SET status = 'cancelled', settled_at = now()
WHERE employee = %(employee)s AND generation = %(generation)s AND lane = %(lane)s
  AND thread = %(thread)s AND status = 'scheduled' AND cancel_on = 'inbound';

-- name: alarms_cancel_generation
-- A retired generation's alarms never fire.
UPDATE alarms SET status = 'cancelled', settled_at = now()
WHERE employee = %(employee)s AND generation = %(generation)s AND status = 'scheduled';

-- name: alarms_take_due
-- Due alarms of a running generation, earliest first, locked (a concurrent attempt skips
-- them); `now` is the transaction's clock (or the caller's, a bench's simulated one), the one
-- the compare-and-swap uses.
SELECT a.id, a.employee, a.generation, a.kind, a.ref, a.lane, a.thread, a.route, a.agent,
       a.text, a.payload, a.due_at, a.if_late, a.skip_after_s, a.repeat, a.occurrence,
       a.chain_id, a.hop, a.path, a.causation_id, COALESCE(%(now)s, now()) AS now
FROM alarms a
JOIN generations g ON g.employee = a.employee AND g.generation = a.generation
WHERE a.employee = %(employee)s AND a.generation = %(generation)s AND a.status = 'scheduled'
  AND a.due_at <= COALESCE(%(now)s, now()) AND g.state = 'running'
ORDER BY a.due_at, a.id
LIMIT %(limit)s
FOR UPDATE OF a SKIP LOCKED;

-- name: alarm_settle
-- A due occurrence moves on (compare-and-swap: still scheduled, due and at this occurrence):
-- `fired` or `missed`, or, for a repeating alarm, scheduled again at its next occurrence.
UPDATE alarms SET status = %(status)s, due_at = %(next_due)s,
    occurrence = CASE WHEN %(status)s = 'scheduled' THEN occurrence + 1 ELSE occurrence END,
    fired_at = CASE WHEN %(fired)s THEN %(now)s ELSE fired_at END,
    settled_at = CASE WHEN %(status)s = 'scheduled' THEN NULL ELSE %(now)s END
WHERE id = %(id)s AND status = 'scheduled' AND due_at <= %(now)s AND occurrence = %(occurrence)s
RETURNING id;

-- name: alarms_next_due
-- The earliest scheduled alarm of a running generation (the supervisor's `alarms` deadline):
-- none while the database has it paused, so a supervisor that has not heard of the pause yet
-- does not come back at once for alarms `fire_due` would not take.
SELECT min(a.due_at) AS due_at FROM alarms a
JOIN generations g ON g.employee = a.employee AND g.generation = a.generation
WHERE a.employee = %(employee)s AND a.generation = %(generation)s AND a.status = 'scheduled'
  AND g.state = 'running';

-- name: alarms_overdue_generations
-- Running generations with scheduled alarms overdue by more than `late_s` (by the database's
-- clock): their supervisor did not fire them (a lost `alarms_changed` hint, a supervisor down).
SELECT a.employee, a.generation,
       coalesce(g.spec->'spec'->>'timezone', 'UTC') AS zone, count(*) AS overdue
FROM alarms a
JOIN generations g ON g.employee = a.employee AND g.generation = a.generation
WHERE a.status = 'scheduled' AND a.due_at < now() - make_interval(secs => %(late_s)s)
  AND g.state = 'running'
GROUP BY a.employee, a.generation, 3
ORDER BY min(a.due_at)
LIMIT %(limit)s;
