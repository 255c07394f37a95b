-- name: grpc_drivers
-- Every driver the grpc triggers of starting, running or paused generations declare: its source and token reference.
SELECT DISTINCT s.source_key, s.params->>'token' AS token_ref
FROM bus_subscriptions s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE s.trigger_kind = 'grpc' AND g.state IN ('starting', 'running', 'paused');
