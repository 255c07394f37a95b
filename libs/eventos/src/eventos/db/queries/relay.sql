-- name: stream_claim
-- Lease up to `limit` streams with pending input, top class first, then oldest pending.
-- The stream rows are locked (SKIP LOCKED) only while claiming; the lease is what lasts,
-- and each new holder's fencing token is one higher than the last.
WITH candidates AS (
    SELECT s.stream_key
    FROM bus_streams s
    LEFT JOIN bus_leases l ON l.name = 'relay:' || s.stream_key
    WHERE s.top_pending_class = ANY(%(classes)s) AND s.hold_reason IS NULL
      AND (l.name IS NULL OR l.until < now())
    ORDER BY s.top_pending_class, s.oldest_pending_at
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
)
INSERT INTO bus_leases (name, owner, until, fencing_token)
SELECT 'relay:' || stream_key, %(owner)s, now() + make_interval(secs => %(ttl_s)s), 1
FROM candidates
ON CONFLICT (name) DO UPDATE
    SET owner = EXCLUDED.owner, until = EXCLUDED.until,
        fencing_token = bus_leases.fencing_token + 1
    WHERE bus_leases.until < now()
RETURNING substr(name, 7) AS stream_key, fencing_token;

-- name: lease_release
-- Give a stream lease back early (only while we still hold it).
UPDATE bus_leases SET until = now()
WHERE name = 'relay:' || %(stream_key)s AND owner = %(owner)s AND fencing_token = %(token)s;

-- name: stream_for_relay
-- A leased stream with its generation's state and its window use (inputs delivered to the
-- entity and not yet consumed).
SELECT s.stream_key, s.employee, s.generation, s.lane, s.thread, s.delivered_seq, s.consumed_seq,
       s.hold_reason, s.entity_id, g.state AS generation_state,
       w.inputs AS window_inputs, w.bytes AS window_bytes
FROM bus_streams s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
CROSS JOIN LATERAL (
    SELECT count(*) AS inputs, coalesce(sum(size), 0) AS bytes
    FROM bus_deliveries d WHERE d.stream_key = s.stream_key AND d.status = 'delivered'
) w
WHERE s.stream_key = %(stream_key)s;

-- name: deliveries_next_batch
-- The next pending inputs of a stream, in seq order.
SELECT seq, ingress_id, class, type, route, chain_id, hop, causation_id, size, payload, body_ref,
       attempts
FROM bus_deliveries
WHERE stream_key = %(stream_key)s AND status = 'pending' AND seq > %(after)s
ORDER BY seq LIMIT %(limit)s;

-- name: stream_mark_delivered
-- Temporal accepted the batch: advance delivered_seq, fenced by the lease's token.
WITH lease AS (
    SELECT 1 FROM bus_leases
    WHERE name = 'relay:' || %(stream_key)s AND owner = %(owner)s AND fencing_token = %(token)s
    FOR SHARE
)
UPDATE bus_streams SET delivered_seq = greatest(delivered_seq, %(through)s), updated_at = now()
WHERE stream_key = %(stream_key)s AND EXISTS (SELECT 1 FROM lease)
RETURNING delivered_seq;

-- name: deliveries_mark_delivered
-- The batch's inputs are with the entity now.
UPDATE bus_deliveries SET status = 'delivered', attempts = attempts + 1, updated_at = now()
WHERE stream_key = %(stream_key)s AND status = 'pending' AND seq <= %(through)s;

-- name: stream_refresh_pending
-- Recompute the relay's ordering columns from what is still pending.
UPDATE bus_streams s
SET top_pending_class = p.top_class, oldest_pending_at = p.oldest, updated_at = now()
FROM (
    SELECT min(class) AS top_class, min(created_at) AS oldest
    FROM bus_deliveries WHERE stream_key = %(stream_key)s AND status = 'pending'
) p
WHERE s.stream_key = %(stream_key)s;

-- name: stream_hold_window
-- The entity holds a full window: stop sending until it consumes.
UPDATE bus_streams SET hold_reason = 'window', updated_at = now()
WHERE stream_key = %(stream_key)s AND hold_reason IS NULL;

-- name: deliveries_kill_stream
-- The stream's generation no longer runs: its open inputs become dead(reset).
UPDATE bus_deliveries SET status = 'dead', reason = 'reset', updated_at = now()
WHERE stream_key = %(stream_key)s AND status IN ('pending', 'held');

-- name: delivery_rejected
-- Temporal refused a batch deterministically: count an attempt on its first input.
UPDATE bus_deliveries SET attempts = attempts + 1, reason = %(reason)s, updated_at = now()
WHERE stream_key = %(stream_key)s AND seq = %(seq)s
RETURNING attempts;

-- name: delivery_dead_letter
-- An input Temporal keeps refusing is dead-lettered so the stream goes on.
UPDATE bus_deliveries SET status = 'dead', reason = %(reason)s, updated_at = now()
WHERE stream_key = %(stream_key)s AND seq = %(seq)s AND status = 'pending';
