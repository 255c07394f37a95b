-- name: metrics_open_deliveries
-- The open deliveries by class and their stream's hold (NULL: not held): how many and the age of
-- the oldest, by the database's clock. The relay reads it every 15 s for its gauges.
SELECT d.class, s.hold_reason, count(*) AS n,
       extract(epoch FROM clock_timestamp() - min(d.created_at))::float8 AS oldest_s
FROM bus_deliveries d
JOIN bus_streams s ON s.stream_key = d.stream_key
WHERE d.status IN ('pending', 'held')
GROUP BY d.class, s.hold_reason;

-- name: metrics_edge_breakers_open
-- The open breakers between employees (SPEC §10, storm guards; half open ones probe).
SELECT count(*) AS n FROM storm_edges WHERE breaker = 'open';

-- name: metrics_outbox_depth
-- What egress has to send, by status (on the `outbound_messages_open` index; rows held for an
-- approval are not egress's yet). Egress reads it every 15 s for its gauge.
SELECT status, count(*) AS n
FROM outbound_messages
WHERE status IN ('queued', 'sending')
GROUP BY status;
