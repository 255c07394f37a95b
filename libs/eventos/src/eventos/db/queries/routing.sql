-- name: ingress_sources_lock
-- One router per source at a time, for the rest of this transaction: which of the sources
-- this transaction locked (another router holds the others).
SELECT s.source_key,
       pg_try_advisory_xact_lock(hashtextextended('eventos.route:' || s.source_key, 0)) AS locked
FROM unnest(%(sources)s::text[]) WITH ORDINALITY AS s(source_key, n)
ORDER BY s.n;

-- name: subscriptions_for_sources
-- Subscriptions of routable generations listening to the sources, with the generations locked
-- (shared) so a concurrent activate/stop sees our streams.
SELECT s.id, s.source_key, s.employee, s.generation, s.trigger_name, s.trigger_kind,
       s.event_types, s.filter, s.class, s.thread_by, s.lane, s.agent, s.reply_capable,
       s.debounce, s.on_busy, g.state AS generation_state
FROM bus_subscriptions s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE s.source_key = ANY(%(sources)s::text[]) AND g.state IN ('starting', 'running', 'paused')
ORDER BY s.id
FOR SHARE OF g;

-- name: ingress_next_for_sources
-- The next accepted rows of each source (up to its limit), in acceptance order; the envelope
-- only for the sources whose routing reads it (the deliveries copy it inside the database);
-- a replayed delivery's one trigger.
SELECT i.id, i.source_key, i.dedupe_key, i.type, i.class, i.received_at,
       CASE WHEN s.envelope THEN i.envelope END AS envelope, i.body_ref, i.size, i.chain_id,
       i.hop, i.causation_id, i.path, i.replay_employee, i.replay_trigger
FROM unnest(%(sources)s::text[], %(envelopes)s::boolean[], %(limits)s::integer[])
    WITH ORDINALITY AS s(source_key, envelope, max_rows, n)
CROSS JOIN LATERAL (
    SELECT * FROM bus_ingress b
    WHERE b.status = 'accepted' AND b.source_key = s.source_key
    ORDER BY b.id LIMIT s.max_rows
) i
ORDER BY s.n, i.id;

-- name: routing_write_batch
-- A batch of routed rows in one statement, its inputs as JSON documents. Each touched stream
-- (locked in key order, so routers never deadlock on them) is created or locked and takes its
-- `n` seqs at once: its new next_seq - n is the first; a new stream starts held when its
-- generation is starting or paused. Each delivery takes first + k (k: its place among the
-- batch's deliveries to that stream, in ingress id order), with type, payload, body and causal
-- fields copied inside the database from its ingress row (found through the row's mark). The
-- rows are marked, and inbound deliveries end their threads' `cancel_on: inbound` alarms.
-- (stream, seq) and (ingress, subscription) stay unique: a second routing of a row fails
-- instead of duplicating it.
WITH settled AS (
    SELECT * FROM json_to_recordset(%(marks)s::json)
        AS m(id bigint, received_at timestamptz, status text, error text)
), wanted AS (
    SELECT * FROM json_to_recordset(%(streams)s::json) AS w(stream_key text, employee text,
        generation integer, lane text, thread text, hold_reason text, entity_id text,
        class smallint, n integer)
), taken AS (
    INSERT INTO bus_streams AS s (stream_key, employee, generation, lane, thread, next_seq,
        hold_reason, entity_id, top_pending_class, oldest_pending_at)
    SELECT stream_key, employee, generation, lane, thread, 1 + n, hold_reason, entity_id,
        class, now()
    FROM wanted ORDER BY stream_key
    ON CONFLICT (stream_key) DO UPDATE
        SET next_seq = s.next_seq + EXCLUDED.next_seq - 1,
            top_pending_class = least(s.top_pending_class, EXCLUDED.top_pending_class),
            oldest_pending_at = coalesce(s.oldest_pending_at, EXCLUDED.oldest_pending_at),
            updated_at = now()
    RETURNING s.stream_key, s.next_seq
), delivered AS (
    INSERT INTO bus_deliveries (stream_key, seq, ingress_id, ingress_received_at,
        subscription_id, route, class, thread, type, payload, body_ref, size, chain_id, hop,
        causation_id)
    SELECT d.stream_key, t.next_seq - w.n + d.k, i.id, i.received_at, d.subscription_id,
        d.route, d.class, w.thread, i.type, i.envelope, i.body_ref, i.size, i.chain_id, i.hop,
        i.causation_id
    FROM json_to_recordset(%(deliveries)s::json) AS d(stream_key text, k integer,
        ingress_id bigint, subscription_id bigint, route jsonb, class smallint)
    JOIN taken t ON t.stream_key = d.stream_key
    JOIN wanted w ON w.stream_key = d.stream_key
    JOIN settled m ON m.id = d.ingress_id
    JOIN bus_ingress i ON i.id = m.id AND i.received_at = m.received_at
    RETURNING 1
), marked AS (
    UPDATE bus_ingress b SET status = m.status, error = m.error, routed_at = now()
    FROM settled m
    WHERE b.id = m.id AND b.received_at = m.received_at
    RETURNING 1
), cancelled AS (
    UPDATE alarms a SET status = 'cancelled', settled_at = now()
    FROM json_to_recordset(%(follow_ups)s::json)
        AS f(employee text, generation integer, lane text, thread text)
    WHERE a.employee = f.employee AND a.generation = f.generation AND a.lane = f.lane
      AND a.thread = f.thread AND a.status = 'scheduled' AND a.cancel_on = 'inbound'
    RETURNING 1
)
SELECT (SELECT count(*) FROM delivered) AS deliveries, (SELECT count(*) FROM marked) AS marked,
       (SELECT count(*) FROM cancelled) AS cancelled;
