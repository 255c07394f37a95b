-- name: watch_turns
-- Running turns with their age not counting the time they held no slot (suspended or parked),
-- and the time since their last completed step.
SELECT t.id, t.employee, t.class, s.entity_id, t.slow_alerted_at, t.backstop_at,
       l.state AS lease_state,
       extract(epoch FROM %(now)s - t.started_at) - t.held_s
           - coalesce(CASE WHEN l.state = 'suspended'
                      THEN extract(epoch FROM %(now)s - l.suspended_at) END, 0) AS active_s,
       extract(epoch FROM %(now)s - coalesce(t.last_step_at, t.started_at)) AS idle_s
FROM turns t
JOIN bus_streams s ON s.stream_key = t.stream_key
LEFT JOIN sched_leases l ON l.turn_id = t.id
WHERE t.status = 'running'
ORDER BY t.started_at
LIMIT %(limit)s;

-- name: turn_slow_alerted
-- The slow-turn alert is raised once per turn.
UPDATE turns SET slow_alerted_at = %(now)s
WHERE id = %(turn_id)s AND slow_alerted_at IS NULL
RETURNING id;

-- name: turn_backstopped
-- The backstop cancelled the turn (it is terminated if still running 2 minutes later).
UPDATE turns SET backstop_at = %(now)s WHERE id = %(turn_id)s AND backstop_at IS NULL;
