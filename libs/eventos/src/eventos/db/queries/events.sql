-- name: event_positions_lock
-- One sequencer at a time (across processes): it gives places in the order its runs commit.
SELECT pg_advisory_xact_lock(hashtextextended('eventos.event_positions', 0));

-- name: event_positions_assign
-- Give committed events without a place the next places, oldest first, up to `limit` of each
-- table; tell the streams (at commit) which were placed: `operator`, or `chat:<employee>`.
-- Run after event_positions_lock, in its transaction: this statement's snapshot sees every
-- place given before, and nothing placed here is visible before all of it is.
WITH ops AS (
    UPDATE operator_events e SET pos = p.pos
    FROM (SELECT id, nextval('event_positions') AS pos
          FROM (SELECT id FROM operator_events WHERE pos IS NULL ORDER BY id LIMIT %(limit)s) q
    ) p
    WHERE e.id = p.id
    RETURNING e.id
), chats AS (
    UPDATE chat_events c SET pos = p.pos
    FROM (SELECT id, nextval('event_positions') AS pos
          FROM (SELECT id FROM chat_events WHERE pos IS NULL ORDER BY id LIMIT %(limit)s) q
    ) p
    WHERE c.id = p.id
    RETURNING c.employee
), told AS (
    SELECT pg_notify('eventos_events_placed', t.topic)
    FROM (SELECT 'operator' AS topic WHERE EXISTS (SELECT 1 FROM ops)
          UNION SELECT DISTINCT 'chat:' || employee FROM chats) t
)
SELECT (SELECT count(*) FROM ops) AS operator, (SELECT count(*) FROM chats) AS chat,
       ARRAY(SELECT DISTINCT employee FROM chats) AS chat_employees,
       (SELECT count(*) FROM told) AS told;

-- name: operator_events_top
-- The last place given, as this statement sees it (every place up to it is final), and the
-- place up to which the retention may have deleted events.
SELECT coalesce((SELECT max(pos) FROM operator_events), 0) AS top,
       (SELECT through FROM operator_events_pruned) AS pruned;

-- name: operator_events_after
-- One read of the operator stream: events placed in (`after`, `through`] — a bounded range of
-- places, so a read whose filters match little still walks a bounded part of the index — of
-- the caller's audience unless admin, optionally of one employee and of some kinds or families.
SELECT pos, at, employee, kind, ref, state, detail FROM operator_events
WHERE pos > %(after)s AND pos <= %(through)s
  AND (%(admin)s OR (audience = %(audience)s
                     AND (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)))
  AND (%(employee)s::text IS NULL OR employee = %(employee)s::text)
  AND (cardinality(%(kinds)s::text[]) = 0 OR kind = ANY(%(kinds)s::text[])
       OR split_part(kind, '.', 1) = ANY(%(kinds)s::text[]))
ORDER BY pos
LIMIT %(limit)s;

-- name: operator_events_expire
-- Events past the retention (7 days), a batch at a time through the BRIN index on `at`; the
-- highest place deleted is remembered, so a reader resuming below it is told it is gone.
WITH gone AS (
    DELETE FROM operator_events WHERE id = ANY(ARRAY(
        SELECT id FROM operator_events
        WHERE at < now() - make_interval(days => %(days)s)
        LIMIT %(limit)s))
    RETURNING pos
), marked AS (
    UPDATE operator_events_pruned SET through = greatest(through, (SELECT max(pos) FROM gone))
    WHERE EXISTS (SELECT 1 FROM gone WHERE pos IS NOT NULL)
)
SELECT count(*) AS n FROM gone;
