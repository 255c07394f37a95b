-- name: ingress_append
-- Append a batch (one jsonb array of records) in one statement, outcomes in the records' order.
-- A key seen within its dedupe window is a duplicate: it answers the earlier id and counts on
-- that row's dup_count; an expired dedupe row is taken over. ON CONFLICT cannot touch one row
-- twice, so only a key's first record in the batch is inserted; the later ones are duplicates
-- of whatever the first became. Run after ingress_source_append_lock, in its own statement:
-- the snapshot must be taken after the lock, so an earlier batch of the source is visible.
WITH batch AS MATERIALIZED (
    SELECT r.*, min(r.ord) OVER key AS first_ord, count(*) OVER key - 1 AS dups
    FROM ROWS FROM (jsonb_to_recordset(%(records)s) AS (source_key text, dedupe_key text,
            type text, class smallint, ttl_s integer, envelope jsonb, body_ref text,
            size integer, chain_id text, hop integer, causation_id text, path text,
            status text, error text))
        WITH ORDINALITY AS r(source_key, dedupe_key, type, class, ttl_s, envelope, body_ref,
            size, chain_id, hop, causation_id, path, status, error, ord)
    WINDOW key AS (PARTITION BY r.source_key, r.dedupe_key)
), firsts AS MATERIALIZED (
    SELECT b.*, nextval('bus_ingress_id_seq') AS new_id
    FROM (SELECT * FROM batch WHERE ord = first_ord ORDER BY ord) b
), fresh AS (
    INSERT INTO bus_dedupe (source_key, dedupe_key, ingress_id, received_at, expires_at)
    SELECT source_key, dedupe_key, new_id, %(received_at)s,
        %(received_at)s + make_interval(secs => ttl_s)
    FROM firsts
    ON CONFLICT (source_key, dedupe_key) DO UPDATE
        SET ingress_id = EXCLUDED.ingress_id, received_at = EXCLUDED.received_at,
            expires_at = EXCLUDED.expires_at
        WHERE bus_dedupe.expires_at <= EXCLUDED.received_at
    RETURNING ingress_id
), inserted AS (
    INSERT INTO bus_ingress (id, source_key, dedupe_key, type, class, received_at, envelope,
        body_ref, size, chain_id, hop, causation_id, path, status, error, dup_count)
    SELECT f.new_id, f.source_key, f.dedupe_key, f.type, f.class, %(received_at)s, f.envelope,
        f.body_ref, f.size, f.chain_id, f.hop, f.causation_id, f.path, f.status, f.error, f.dups
    FROM firsts f JOIN fresh ON fresh.ingress_id = f.new_id
    ORDER BY f.new_id
), earlier AS (
    SELECT f.ord, d.ingress_id, d.received_at, f.dups + 1 AS n
    FROM firsts f JOIN bus_dedupe d USING (source_key, dedupe_key)
    WHERE NOT EXISTS (SELECT 1 FROM fresh WHERE fresh.ingress_id = f.new_id)
), counted AS (
    UPDATE bus_ingress i SET dup_count = i.dup_count + e.n
    FROM earlier e WHERE i.id = e.ingress_id AND i.received_at = e.received_at
)
SELECT b.ord, (fresh.ingress_id IS NOT NULL AND b.ord = b.first_ord) AS accepted,
    coalesce(fresh.ingress_id, e.ingress_id) AS id
FROM batch b
JOIN firsts f ON f.ord = b.first_ord
LEFT JOIN fresh ON fresh.ingress_id = f.new_id
LEFT JOIN earlier e ON e.ord = b.first_ord
ORDER BY b.ord;

-- name: ingress_unrouted_count
-- Accepted, not yet routed rows of one source (for the backlog high water).
SELECT count(*) AS n FROM (
    SELECT 1 FROM bus_ingress WHERE status = 'accepted' AND source_key = %(source_key)s
    LIMIT %(cap)s
) t;

-- name: ingress_sources_pending
-- Sources with accepted rows, those holding the highest class first (the owner's chat is never
-- left for a later pass behind a backlog of background sources), then oldest first. With
-- `owner` true only the sources holding owner (C1) rows, with false only the others, with NULL
-- all: the router's owner lane routes the former in passes of their own.
SELECT source_key FROM bus_ingress WHERE status = 'accepted'
GROUP BY source_key
HAVING %(owner)s::bool IS NULL OR coalesce(min(class) = 1, false) = %(owner)s::bool
ORDER BY min(class) NULLS LAST, min(id) LIMIT %(limit)s;

-- name: ingress_mark
-- Settle one ingress row after routing.
UPDATE bus_ingress SET status = %(status)s, error = %(error)s, routed_at = now()
WHERE id = %(id)s AND received_at = %(received_at)s;

-- name: stream_allocate_seq
-- Create or lock the stream row and take its next seq.
INSERT INTO bus_streams (stream_key, employee, generation, lane, thread, next_seq, hold_reason,
    entity_id, top_pending_class, oldest_pending_at)
VALUES (%(stream_key)s, %(employee)s, %(generation)s, %(lane)s, %(thread)s, 2, %(hold_reason)s,
    %(entity_id)s, %(class)s, now())
ON CONFLICT (stream_key) DO UPDATE
    SET next_seq = bus_streams.next_seq + 1,
        top_pending_class = least(bus_streams.top_pending_class, EXCLUDED.top_pending_class),
        oldest_pending_at = coalesce(bus_streams.oldest_pending_at, EXCLUDED.oldest_pending_at),
        updated_at = now()
RETURNING next_seq - 1 AS seq;

-- name: delivery_insert
-- One delivery of an ingress row to a stream.
INSERT INTO bus_deliveries (stream_key, seq, ingress_id, ingress_received_at, subscription_id,
    route, class, thread, type, payload, body_ref, size, chain_id, hop, causation_id)
VALUES (%(stream_key)s, %(seq)s, %(ingress_id)s, %(ingress_received_at)s, %(subscription_id)s,
    %(route)s, %(class)s, %(thread)s, %(type)s, %(payload)s, %(body_ref)s, %(size)s, %(chain_id)s,
    %(hop)s, %(causation_id)s);

-- name: dedupe_expire
-- Forget dedupe keys past their window.
DELETE FROM bus_dedupe WHERE expires_at < now();

-- name: blob_insert
-- A body's row; its content follows as chunks in the same transaction.
INSERT INTO event_blobs (id, sha256, size) VALUES (%(id)s, %(sha256)s, %(size)s);

-- name: blob_chunks_copy
-- The content of one body, streamed in chunks (binary COPY: blob_id, n, content).
COPY event_blob_chunks (blob_id, n, content) FROM STDIN (FORMAT BINARY);

-- name: blob_exists
-- Whether a body reference is valid.
SELECT 1 AS found FROM event_blobs WHERE id = %(id)s;

-- name: blob_get
-- A body's row.
SELECT id, sha256, size, storage_path FROM event_blobs WHERE id = %(id)s;

-- name: blob_chunks
-- A body's content, in order.
SELECT content FROM event_blob_chunks WHERE blob_id = %(id)s ORDER BY n;

-- name: blob_expire
-- Bodies past their retention (SPEC §15): 7 days, and longer while a dead letter (a dead
-- delivery, a dead ingress row: kept 90 days, then deleted) or a delivery not yet finished
-- refers to them, so a dead letter stays replayable. In batches, oldest first.
DELETE FROM event_blobs WHERE id IN (
    SELECT b.id FROM event_blobs b
    WHERE b.created_at < now() - make_interval(days => %(retention_days)s)
      AND NOT EXISTS (SELECT 1 FROM bus_deliveries d
                      WHERE d.body_ref = b.id
                        AND d.status IN ('pending', 'held', 'delivered', 'dead'))
      AND NOT EXISTS (SELECT 1 FROM bus_ingress i
                      WHERE i.body_ref = b.id AND i.status = 'dead')
    ORDER BY b.created_at
    LIMIT %(limit)s
);

-- name: ingress_source_append_lock
-- Appends of one source commit one transaction at a time, so ids of a source are assigned
-- in commit order and a router that sees id N has already seen every smaller id of it.
-- unnest yields the (sorted) sources in array order, so locks are taken in that order.
SELECT pg_advisory_xact_lock(hashtextextended('eventos.append:' || s, 0))
FROM unnest(%(sources)s::text[]) AS s;
