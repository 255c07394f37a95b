-- name: transcript_head
-- The transcript's version (message count, byte total), locked for the consuming save.
SELECT transcript_n, transcript_total FROM conversations
WHERE employee = %(employee)s AND generation = %(generation)s AND agent = %(agent)s
  AND thread = %(thread)s
FOR UPDATE;

-- name: transcript_append
-- A turn's messages, numbered on from the head, with where each starts in bytes.
INSERT INTO transcript_messages (employee, generation, agent, thread, n, start_bytes, bytes,
    message, turn_id)
SELECT %(employee)s, %(generation)s, %(agent)s, %(thread)s, m.n, m.start_bytes, m.bytes,
    m.message, %(turn_id)s
FROM unnest(%(n)s::bigint[], %(start_bytes)s::bigint[], %(bytes)s::integer[],
            %(message)s::jsonb[]) AS m (n, start_bytes, bytes, message);

-- name: transcript_advance
-- The new head; the oldest rows past the stored bound go (one index range).
WITH head AS (
    UPDATE conversations SET transcript_n = %(n)s, transcript_total = %(total)s,
        updated_at = now()
    WHERE employee = %(employee)s AND generation = %(generation)s AND agent = %(agent)s
      AND thread = %(thread)s
)
DELETE FROM transcript_messages
WHERE employee = %(employee)s AND generation = %(generation)s AND agent = %(agent)s
  AND thread = %(thread)s AND start_bytes < %(keep_from)s;

-- name: transcript_recent
-- Version `through`'s messages after `after` that start at `floor` bytes or later, in order.
SELECT start_bytes, message FROM transcript_messages
WHERE employee = %(employee)s AND generation = %(generation)s AND agent = %(agent)s
  AND thread = %(thread)s AND n > %(after)s AND n <= %(through)s AND start_bytes >= %(floor)s
ORDER BY n;
