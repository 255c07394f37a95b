-- name: stream_claim
-- Lease up to `limit` streams with pending input, top class first, then oldest pending.
-- The stream rows are locked (SKIP LOCKED) only while claiming; the lease is what lasts,
-- and each new holder's fencing token is one higher than the last. A stream whose entity
-- waits for a slot of its top pending class or a higher one, and takes what was held for it
-- when granted (`takes_held`), is left for that grant (stream_held).
WITH candidates AS (
    SELECT s.stream_key, s.top_pending_class
    FROM bus_streams s
    LEFT JOIN bus_leases l ON l.name = 'relay:' || s.stream_key
    WHERE s.top_pending_class = ANY(%(classes)s) AND s.hold_reason IS NULL
      AND (l.name IS NULL OR l.until < now())
      AND NOT EXISTS (SELECT 1 FROM sched_waiters w
                      WHERE w.stream_key = s.stream_key AND w.takes_held
                        AND w.class <= s.top_pending_class)
    ORDER BY s.top_pending_class, s.oldest_pending_at
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
), claimed AS (
    INSERT INTO bus_leases (name, owner, until, fencing_token)
    SELECT 'relay:' || stream_key, %(owner)s, now() + make_interval(secs => %(ttl_s)s), 1
    FROM candidates
    ON CONFLICT (name) DO UPDATE
        SET owner = EXCLUDED.owner, until = EXCLUDED.until,
            fencing_token = bus_leases.fencing_token + 1
        WHERE bus_leases.until < now()
    RETURNING name, fencing_token
)
SELECT c.stream_key, l.fencing_token, c.top_pending_class
FROM claimed l JOIN candidates c ON l.name = 'relay:' || c.stream_key
ORDER BY c.top_pending_class;

-- name: leases_release
-- Give several stream leases back at once (only those we still hold, by their tokens).
UPDATE bus_leases l SET until = now()
FROM unnest(%(stream_keys)s::text[], %(tokens)s::bigint[]) AS g(stream_key, token)
WHERE l.name = 'relay:' || g.stream_key AND l.owner = %(owner)s AND l.fencing_token = g.token;

-- name: stream_next_batches
-- Leased streams with their generation's state and flags, their budget's state, whether the employee is degraded, their window use (inputs delivered
-- to the entity and not yet consumed) and their next pending inputs in seq order, up to `limit`
-- and until `max_bytes` is reached: one row per input, or one row with a NULL seq for a stream
-- with none pending. One round trip for the next batches of every stream asked about.
SELECT s.stream_key, s.employee, s.generation, s.lane, s.thread, s.delivered_seq, s.consumed_seq,
       s.hold_reason, s.entity_id, s.top_pending_class, g.state AS generation_state,
       g.spec -> 'spec' -> 'flags' AS flags,
       coalesce(b.state, 'normal') AS budget_state, w.inputs AS window_inputs, w.bytes AS window_bytes,
       h.degraded_since IS NOT NULL AS degraded,
       d.seq, d.ingress_id, d.class, d.type, d.route, d.chain_id, d.hop, d.causation_id, d.size,
       d.payload, d.body_ref, d.attempts,
       extract(epoch FROM clock_timestamp() - d.created_at)::float8 AS age_s
FROM bus_streams s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
LEFT JOIN employee_budgets b ON b.employee = s.employee
LEFT JOIN employee_health h ON h.employee = s.employee
CROSS JOIN LATERAL (
    SELECT count(*) AS inputs, coalesce(sum(size), 0) AS bytes
    FROM bus_deliveries d WHERE d.stream_key = s.stream_key AND d.status = 'delivered'
) w
LEFT JOIN LATERAL (
    SELECT * FROM (
        SELECT d.*, sum(d.size) OVER (ORDER BY d.seq) - d.size AS bytes_before
        FROM bus_deliveries d
        WHERE d.stream_key = s.stream_key AND d.status = 'pending' AND d.seq > s.delivered_seq
        ORDER BY d.seq LIMIT %(limit)s
    ) ahead WHERE ahead.bytes_before < %(max_bytes)s
) d ON true
WHERE s.stream_key = ANY(%(stream_keys)s::text[])
ORDER BY s.stream_key, d.seq;

-- name: stream_commit_delivered
-- Temporal accepted a batch of each stream given (`through`: its batch's last seq): in one
-- statement, each fenced by its own lease's token, the batches' inputs become `delivered`,
-- `delivered_seq` advances and the relay's ordering columns are recomputed from what is still
-- pending. A stream whose lease was taken over is left alone and missing from the result.
-- A delivery the router committed after this statement's snapshot is invisible here: then the
-- router's own values are kept. One stream appears at most once (one call in flight per stream).
-- A stream with `release` gives its lease back in the same statement (its last batch this pass).
-- Lock order, so that no other writer deadlocks with it: the deliveries first (as a turn's save
-- settles them before its stream), then the stream rows in key order (as the router takes
-- them); each step reads the one before it as an InitPlan, which runs it to its end first
-- (a data-modifying CTE nothing reads would run after the main UPDATE, in the join's order).
WITH asked AS (
    SELECT * FROM unnest(%(stream_keys)s::text[], %(tokens)s::bigint[], %(throughs)s::bigint[],
                         %(releases)s::bool[])
        AS a(stream_key, token, through, release)
), lease AS (
    SELECT a.stream_key, a.through, a.release FROM asked a
    JOIN bus_leases l ON l.name = 'relay:' || a.stream_key
    WHERE l.owner = %(owner)s AND l.fencing_token = a.token
    FOR UPDATE OF l
), freed AS (
    UPDATE bus_leases l SET until = now()
    FROM lease WHERE l.name = 'relay:' || lease.stream_key AND lease.release
    RETURNING l.name
), marked AS (
    UPDATE bus_deliveries d SET status = 'delivered', attempts = d.attempts + 1, updated_at = now()
    FROM lease
    WHERE d.stream_key = lease.stream_key AND d.status = 'pending' AND d.seq <= lease.through
    RETURNING d.seq
), locked AS (
    SELECT s.stream_key FROM bus_streams s
    WHERE s.stream_key IN (SELECT stream_key FROM lease) AND (SELECT count(*) FROM marked) >= 0
    ORDER BY s.stream_key
    FOR UPDATE OF s
), facts AS (
    SELECT lease.stream_key, lease.through, seen.last_seq, rest.top_class, rest.oldest
    FROM lease
    CROSS JOIN LATERAL (
        SELECT coalesce(max(seq), 0) AS last_seq FROM bus_deliveries
        WHERE stream_key = lease.stream_key
    ) seen
    CROSS JOIN LATERAL (
        SELECT min(class) AS top_class, min(created_at) AS oldest FROM bus_deliveries
        WHERE stream_key = lease.stream_key AND status = 'pending' AND seq > lease.through
    ) rest
    WHERE (SELECT count(*) FROM locked) >= 0
)
UPDATE bus_streams s
SET delivered_seq = greatest(s.delivered_seq, f.through),
    top_pending_class = CASE WHEN s.next_seq - 1 > f.last_seq
                             THEN s.top_pending_class ELSE f.top_class END,
    oldest_pending_at = CASE WHEN s.next_seq - 1 > f.last_seq
                             THEN s.oldest_pending_at ELSE f.oldest END,
    updated_at = now()
FROM facts f
WHERE s.stream_key = f.stream_key
RETURNING s.stream_key, s.delivered_seq, s.top_pending_class;

-- name: stream_held
-- What an entity granted a slot takes (eventos.delivery.held): the stream's hold and its
-- window use below `after` (the entity's last applied seq), then its inputs above `after` in
-- seq order, up to `limit`: those delivered already (in a Signal not applied yet, or by an
-- earlier try of the same grant) and those pending after `delivered_seq`.
SELECT s.hold_reason, w.inputs AS window_inputs, w.bytes AS window_bytes,
       d.seq, d.ingress_id, d.class, d.type, d.route, d.chain_id, d.hop, d.causation_id, d.size,
       d.payload, d.body_ref, d.status,
       extract(epoch FROM clock_timestamp() - d.created_at)::float8 AS age_s
FROM bus_streams s
CROSS JOIN LATERAL (
    SELECT count(*) AS inputs, coalesce(sum(size), 0) AS bytes
    FROM bus_deliveries x
    WHERE x.stream_key = s.stream_key AND x.status = 'delivered' AND x.seq <= %(after)s
) w
LEFT JOIN LATERAL (
    SELECT * FROM bus_deliveries d
    WHERE d.stream_key = s.stream_key AND d.seq > %(after)s
      AND (d.status = 'delivered' OR (d.status = 'pending' AND d.seq > s.delivered_seq))
    ORDER BY d.seq LIMIT %(limit)s
) d ON true
WHERE s.stream_key = %(stream_key)s
ORDER BY d.seq;

-- name: stream_take_delivered
-- The pending inputs of a stream in (`after`, `through`] become `delivered` (taken by its
-- entity at its grant), `delivered_seq` advances and the relay's ordering columns are
-- recomputed from what is still pending, as stream_commit_delivered does (without a lease:
-- a relay that sends some of them too is dropped by the entity, seq <= applied). The same
-- lock order: the deliveries first, then the stream row.
WITH marked AS (
    UPDATE bus_deliveries SET status = 'delivered', attempts = attempts + 1, updated_at = now()
    WHERE stream_key = %(stream_key)s AND status = 'pending'
      AND seq > %(after)s AND seq <= %(through)s
    RETURNING seq
), locked AS (
    SELECT s.stream_key FROM bus_streams s
    WHERE s.stream_key = %(stream_key)s AND (SELECT count(*) FROM marked) >= 0
    FOR UPDATE OF s
), facts AS (
    SELECT seen.last_seq, rest.top_class, rest.oldest
    FROM (SELECT coalesce(max(seq), 0) AS last_seq FROM bus_deliveries
          WHERE stream_key = %(stream_key)s) seen
    CROSS JOIN (SELECT min(class) AS top_class, min(created_at) AS oldest FROM bus_deliveries
                WHERE stream_key = %(stream_key)s AND status = 'pending'
                  AND seq > %(through)s) rest
    WHERE (SELECT count(*) FROM locked) >= 0
)
UPDATE bus_streams s
SET delivered_seq = greatest(s.delivered_seq, %(through)s),
    top_pending_class = CASE WHEN s.next_seq - 1 > f.last_seq
                             THEN s.top_pending_class ELSE f.top_class END,
    oldest_pending_at = CASE WHEN s.next_seq - 1 > f.last_seq
                             THEN s.oldest_pending_at ELSE f.oldest END,
    updated_at = now()
FROM facts f
WHERE s.stream_key = %(stream_key)s;

-- name: stream_refresh_pending
-- Recompute the relay's ordering columns from what is still pending.
UPDATE bus_streams s
SET top_pending_class = p.top_class, oldest_pending_at = p.oldest, updated_at = now()
FROM (
    SELECT min(class) AS top_class, min(created_at) AS oldest
    FROM bus_deliveries WHERE stream_key = %(stream_key)s AND status = 'pending'
) p
WHERE s.stream_key = %(stream_key)s;

-- name: stream_lock
-- Lock a stream row for the rest of the transaction.
SELECT 1 FROM bus_streams WHERE stream_key = %(stream_key)s FOR UPDATE;

-- name: stream_hold_window
-- The entity holds a full window: stop sending until it consumes. Runs after stream_lock in the
-- same transaction, so the window is counted after any consuming save that held the row (a hold
-- set after the last consumption would never be lifted).
UPDATE bus_streams s SET hold_reason = 'window', updated_at = now()
WHERE s.stream_key = %(stream_key)s AND s.hold_reason IS NULL
  AND (SELECT count(*) >= %(max_inputs)s OR coalesce(sum(d.size), 0) >= %(max_bytes)s
       FROM bus_deliveries d WHERE d.stream_key = s.stream_key AND d.status = 'delivered');

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

-- name: stream_hold_budget
-- Hold a stream whose pending input is all background work while the budget is high.
UPDATE bus_streams SET hold_reason = 'budget', updated_at = now()
WHERE stream_key = %(stream_key)s AND hold_reason IS NULL;
