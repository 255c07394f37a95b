-- name: attention_list
-- Attention items newest first, of the caller's audience unless admin; filters optional
-- (states, employee, kind); `before` is the page cursor (an id).
SELECT id, employee, kind, severity, ref, detail, first_seen, last_seen, count, state, action,
       audience, acked_at, acked_by, resolved_at, resolved_by
FROM attention_items
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
