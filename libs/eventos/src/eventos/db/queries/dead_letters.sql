-- name: dead_letters_list
-- Dead ingress rows and dead deliveries, newest first (`at`: when each died), each with its
-- reason's code (the metrics' label: a known first word, else `other`), its source and, where
-- known, its employee and stream; never content (the preview is the data's key names). Filters
-- are optional: reason code, source (a key or its kind), employee, time range, replayed or not,
-- ids; `as_of` keeps the letters dead and not yet replayed at that time (a replay selector);
-- `after_*` is the page cursor.
SELECT * FROM (
    SELECT 'ingress' AS kind, i.id, coalesce(i.routed_at, i.received_at) AS at,
        CASE WHEN substring(coalesce(i.error, '') FROM '^[a-z_]+') = ANY(%(reasons)s::text[])
             THEN substring(i.error FROM '^[a-z_]+') ELSE 'other' END AS reason,
        left(i.error, 500) AS detail, i.source_key AS source, owner.employee,
        NULL::text AS stream, i.type, i.size, i.chain_id, i.replay_of, i.replayed_at,
        i.replayed_as, NULL::text AS turn_id,
        CASE WHEN jsonb_typeof(doc.data) = 'object' THEN ARRAY(
            SELECT left(k, 40) FROM jsonb_object_keys(doc.data) AS k LIMIT 10) END AS data_keys
    FROM bus_ingress i
    CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(i.envelope -> 'data' -> 'body') = 'object'
                                    THEN i.envelope -> 'data' -> 'body'
                                    ELSE i.envelope -> 'data' END AS data) doc
    LEFT JOIN LATERAL (
        SELECT CASE WHEN count(DISTINCT s.employee) = 1 THEN min(s.employee) END AS employee
        FROM bus_subscriptions s WHERE s.source_key = i.source_key) owner ON true
    WHERE i.status = 'dead'
      AND (NOT %(by_ids)s OR i.id = ANY(%(ingress_ids)s::bigint[]))
      AND (%(employee)s::text IS NULL OR EXISTS (
          SELECT 1 FROM bus_subscriptions s
          WHERE s.source_key = i.source_key AND s.employee = %(employee)s))
    UNION ALL
    SELECT 'delivery', d.id, d.updated_at,
        CASE WHEN substring(coalesce(d.reason, '') FROM '^[a-z_]+') = ANY(%(reasons)s::text[])
             THEN substring(d.reason FROM '^[a-z_]+') ELSE 'other' END,
        left(d.reason, 500), s.source_key, s.employee, d.stream_key, d.type, d.size,
        d.chain_id, o.replay_of, d.replayed_at, d.replayed_as, d.turn_id,
        CASE WHEN jsonb_typeof(doc.data) = 'object' THEN ARRAY(
            SELECT left(k, 40) FROM jsonb_object_keys(doc.data) AS k LIMIT 10) END
    FROM bus_deliveries d
    JOIN bus_subscriptions s ON s.id = d.subscription_id
    LEFT JOIN bus_ingress o ON o.id = d.ingress_id AND o.received_at = d.ingress_received_at
    CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(d.payload -> 'data' -> 'body') = 'object'
                                    THEN d.payload -> 'data' -> 'body'
                                    ELSE d.payload -> 'data' END AS data) doc
    WHERE d.status = 'dead'
      AND (NOT %(by_ids)s OR d.id = ANY(%(delivery_ids)s::bigint[]))
      AND (%(employee)s::text IS NULL OR s.employee = %(employee)s)
) l
WHERE (%(reason)s::text IS NULL OR l.reason = %(reason)s)
  AND (%(source)s::text IS NULL OR l.source = %(source)s
       OR split_part(l.source, ':', 1) = %(source)s)
  AND (%(since)s::timestamptz IS NULL OR l.at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR l.at <= %(until)s)
  AND (%(replayed)s::boolean IS NULL OR (l.replayed_at IS NOT NULL) = %(replayed)s)
  AND (%(as_of)s::timestamptz IS NULL
       OR (l.at <= %(as_of)s AND (l.replayed_at IS NULL OR l.replayed_at > %(as_of)s)))
  AND (%(after_at)s::timestamptz IS NULL
       OR (l.at, l.kind, l.id) < (%(after_at)s, %(after_kind)s::text, %(after_id)s::bigint))
ORDER BY l.at DESC, l.kind DESC, l.id DESC
LIMIT %(limit)s;

-- name: replay_clock
-- The database's time: a replay preview's `as_of`, a confirmation's expiry check.
SELECT now() AS now;

-- name: replay_claim_ingress
-- Mark dead ingress rows replayed (those not replayed yet; a concurrent claim of the same row
-- waits for this one and then finds it taken).
UPDATE bus_ingress SET replayed_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'dead' AND replayed_at IS NULL
RETURNING id, source_key;

-- name: replay_claim_deliveries
-- Mark dead deliveries replayed (those not replayed yet), with the source they came from.
UPDATE bus_deliveries d SET replayed_at = now()
FROM bus_subscriptions s
WHERE d.id = ANY(%(ids)s::bigint[]) AND d.status = 'dead' AND d.replayed_at IS NULL
  AND s.id = d.subscription_id
RETURNING d.id, s.source_key;

-- name: replay_append
-- The claimed letters appended again, copied inside the database: an ingress row routes as it
-- was; a delivery becomes its event once more in its source, bound to its one trigger
-- (`replay_employee`, `replay_trigger`). Each takes the dedupe key `replay:<letter>` in its
-- source and names its letter (`replay_of`). Run after ingress_source_append_lock on their
-- sources (ids of a source in commit order, as every append).
WITH letters AS (
    SELECT 'ingress-' || i.id AS letter, i.source_key, i.type, i.class, i.envelope, i.body_ref,
        i.size, i.chain_id, i.hop, i.causation_id, i.path, NULL::text AS employee,
        NULL::text AS trigger_name, i.id AS original_ingress
    FROM bus_ingress i
    WHERE i.id = ANY(%(ingress_ids)s::bigint[]) AND i.status = 'dead'
    UNION ALL
    SELECT 'delivery-' || d.id, s.source_key, d.type, d.class, d.payload, d.body_ref, d.size,
        d.chain_id, d.hop, d.causation_id, o.path, s.employee, s.trigger_name, d.ingress_id
    FROM bus_deliveries d
    JOIN bus_subscriptions s ON s.id = d.subscription_id
    LEFT JOIN bus_ingress o ON o.id = d.ingress_id AND o.received_at = d.ingress_received_at
    WHERE d.id = ANY(%(delivery_ids)s::bigint[]) AND d.status = 'dead'
), numbered AS MATERIALIZED (
    SELECT l.*, nextval('bus_ingress_id_seq') AS new_id
    FROM (SELECT * FROM letters ORDER BY source_key, letter) l
), keyed AS (
    INSERT INTO bus_dedupe (source_key, dedupe_key, ingress_id, received_at, expires_at)
    SELECT source_key, 'replay:' || letter, new_id, now(), now() + make_interval(secs => %(ttl_s)s)
    FROM numbered
    ON CONFLICT (source_key, dedupe_key) DO UPDATE
        SET ingress_id = EXCLUDED.ingress_id, received_at = EXCLUDED.received_at,
            expires_at = EXCLUDED.expires_at
        WHERE bus_dedupe.expires_at <= EXCLUDED.received_at
    RETURNING ingress_id
), inserted AS (
    INSERT INTO bus_ingress (id, source_key, dedupe_key, type, class, received_at, envelope,
        body_ref, size, chain_id, hop, causation_id, path, replay_of, replay_employee,
        replay_trigger)
    SELECT n.new_id, n.source_key, 'replay:' || n.letter, n.type, n.class, now(), n.envelope,
        n.body_ref, n.size, n.chain_id, n.hop, n.causation_id, n.path, n.letter, n.employee,
        n.trigger_name
    FROM numbered n JOIN keyed k ON k.ingress_id = n.new_id
    ORDER BY n.new_id
    RETURNING id
)
SELECT n.letter, n.new_id, n.original_ingress
FROM numbered n JOIN inserted i ON i.id = n.new_id
ORDER BY n.new_id;

-- name: replay_mark_ingress
-- Each replayed ingress row names the row that replays it.
UPDATE bus_ingress i SET replayed_as = r.new_id
FROM unnest(%(ids)s::bigint[], %(new_ids)s::bigint[]) AS r(id, new_id)
WHERE i.id = r.id AND i.status = 'dead';

-- name: replay_mark_deliveries
-- Each replayed delivery names the ingress row that replays it.
UPDATE bus_deliveries d SET replayed_as = r.new_id
FROM unnest(%(ids)s::bigint[], %(new_ids)s::bigint[]) AS r(id, new_id)
WHERE d.id = r.id;

-- name: replay_chat_messages
-- An owner's message follows its replay: queued again under the new ingress row, so its reply
-- (or its second death) shows on the message the owner sent.
UPDATE chat_messages m SET ingress_id = r.new_id, status = 'queued', turn_id = NULL
FROM unnest(%(ids)s::bigint[], %(new_ids)s::bigint[]) AS r(id, new_id)
WHERE m.ingress_id = r.id AND m.status IN ('queued', 'delivered', 'dead');

-- name: replay_dead_inputs
-- The dead, not yet replayed deliveries a `dead_input` item names (`<stream>#<first>-<last>`).
SELECT id FROM bus_deliveries
WHERE stream_key = %(stream_key)s AND seq BETWEEN %(first)s AND %(last)s AND status = 'dead'
  AND replayed_at IS NULL
ORDER BY seq;
