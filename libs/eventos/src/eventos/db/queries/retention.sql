-- name: deliveries_expire
-- Finished deliveries past the retention (SPEC §15): done, failed or expired ones after `days`, dead
-- ones (dead letters) after `dead_days`; never one still pending, held or delivered. At most
-- `limit` of each a pass, oldest first (bus_deliveries_finished, bus_deliveries_dead).
WITH doomed AS (
    (SELECT id FROM bus_deliveries
     WHERE status IN ('done', 'failed', 'expired') AND updated_at < now() - make_interval(days => %(days)s)
     ORDER BY updated_at LIMIT %(limit)s)
    UNION ALL
    (SELECT id FROM bus_deliveries
     WHERE status = 'dead' AND updated_at < now() - make_interval(days => %(dead_days)s)
     ORDER BY updated_at, id LIMIT %(limit)s)
), gone AS (
    DELETE FROM bus_deliveries d USING doomed
    WHERE d.id = doomed.id AND d.status IN ('done', 'failed', 'expired', 'dead')
    RETURNING 1
)
SELECT count(*) AS n FROM gone;

-- name: dead_ingress_expire
-- Dead ingress rows kept past their partition (bus_ingress_kept), 90 days after they died; at
-- most `limit` a pass, oldest first (bus_ingress_dead).
WITH gone AS (
    DELETE FROM bus_ingress_kept WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM bus_ingress_kept
        WHERE status = 'dead'
          AND coalesce(routed_at, received_at) < now() - make_interval(days => %(days)s)
        ORDER BY coalesce(routed_at, received_at), id
        LIMIT %(limit)s))
    RETURNING 1
)
SELECT count(*) AS n FROM gone;
