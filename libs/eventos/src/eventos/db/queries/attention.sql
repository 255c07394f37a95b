-- name: attention_list
-- Attention items newest first, of the caller's audience unless admin; filters optional
-- (states, employee, kind); `before` is the page cursor (an id). `turn_id`: the turn the item
-- is about, found through its ref (a turn, `outbox#<id>`, `approval#<id>`, a tool call's key,
-- or `<stream>#<first seq>-<last seq>` of inputs a failed turn dead-lettered), by primary key.
SELECT id, employee, kind, severity, ref, detail, first_seen, last_seen, count, state, action,
       audience, acked_at, acked_by, resolved_at, resolved_by,
       coalesce(
           (SELECT t.id FROM turns t WHERE t.id = a.ref AND t.employee = a.employee),
           (SELECT o.turn_id FROM outbound_messages o
            WHERE a.ref ~ '^outbox#[0-9]{1,18}$' AND o.id = substring(a.ref FROM 8)::bigint
              AND o.employee = a.employee),
           (SELECT p.turn_id FROM approvals p
            WHERE a.ref LIKE 'approval#%%' AND p.id = substring(a.ref FROM 10)
              AND p.employee = a.employee),
           (SELECT c.turn_id FROM tool_calls c WHERE c.id = a.ref AND c.employee = a.employee),
           (SELECT d.turn_id FROM bus_deliveries d
            WHERE a.ref ~ '#[0-9]{1,18}-[0-9]{1,18}$'
              AND d.stream_key = substring(a.ref FROM '^(.*)#[0-9]+-[0-9]+$')
              AND d.seq = substring(a.ref FROM '#([0-9]+)-[0-9]+$')::bigint)
       ) AS turn_id
FROM attention_items a
WHERE (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
  AND (%(employee)s::text IS NULL OR employee = %(employee)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(admin)s OR (audience = %(audience)s
                     AND (%(since)s::timestamptz IS NULL OR first_seen >= %(since)s::timestamptz)))
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: attention_item_ack
-- Acknowledge an open item: it stays listed (`acked`) until resolved; repeats count on it.
UPDATE attention_items SET state = 'acked', acked_at = now(), acked_by = %(by)s
WHERE id = %(id)s AND state = 'open';

-- name: attention_item_close
-- Resolve an item by hand (who did it is kept).
UPDATE attention_items SET state = 'resolved', resolved_at = now(), resolved_by = %(by)s
WHERE id = %(id)s AND state IN ('open', 'acked');

-- name: attention_item_get
-- An attention item, not locked: read before what its action locks first (a thread's stream,
-- an employee's health row: the supervision pass's order, so the two cannot deadlock).
SELECT id, employee, kind, severity, ref, detail, first_seen, last_seen, count, state, action,
       audience, acked_at, acked_by, resolved_at, resolved_by
FROM attention_items WHERE id = %(id)s;
