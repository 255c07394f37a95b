-- name: cron_ticks_expire
-- SPEC §15, one pending tick per schedule: of the cron ticks not yet handed to their entity, of
-- these subscriptions or in these streams, one a newer tick of its trigger follows in its
-- stream is `expired` (the newest wins), and so is one pending longer than its interval
-- (`data.every_s`, set when it fired). The router runs it as it routes ticks, the relay before
-- it sends one (a hold just lifted).
WITH ticks AS (
    SELECT d.id, d.seq, d.ingress_received_at,
           (d.payload -> 'data' ->> 'every_s')::float8 AS every_s,
           max(d.seq) OVER (PARTITION BY d.stream_key, d.subscription_id) AS newest
    FROM bus_deliveries d
    JOIN bus_streams s ON s.stream_key = d.stream_key
    WHERE (d.subscription_id = ANY(%(subscriptions)s::bigint[])
           OR d.stream_key = ANY(%(stream_keys)s::text[]))
      AND d.status = 'pending' AND d.type = 'eventos.trigger.cron' AND d.seq > s.delivered_seq
), doomed AS (
    SELECT id,
           CASE WHEN seq < newest THEN 'superseded: a newer tick of its schedule came'
                ELSE 'stale: pending longer than one interval of its schedule ('
                     || round(every_s) || ' s)' END AS reason
    FROM ticks
    WHERE seq < newest OR ingress_received_at < clock_timestamp() - make_interval(secs => every_s)
)
UPDATE bus_deliveries d SET status = 'expired', reason = doomed.reason, updated_at = now()
FROM doomed
WHERE d.id = doomed.id AND d.status = 'pending'
RETURNING d.stream_key, d.seq, d.reason;
