-- SPEC §15 staleness (issue 26 point 10): a delivery that waited past its bound is `expired`
-- with its reason — a cron tick superseded by a newer one of its schedule or older than one
-- interval, a message or task from another employee undelivered past 24 h — and so is that
-- task. Expired deliveries are finished: kept 30 days like done ones, told in the timeline.
ALTER TABLE bus_deliveries DROP CONSTRAINT bus_deliveries_status_check;
ALTER TABLE bus_deliveries ADD CONSTRAINT bus_deliveries_status_check
    CHECK (status IN ('pending', 'held', 'delivered', 'done', 'failed', 'dead', 'expired'));
ALTER TABLE ipc_tasks DROP CONSTRAINT ipc_tasks_status_check;
ALTER TABLE ipc_tasks ADD CONSTRAINT ipc_tasks_status_check
    CHECK (status IN ('open', 'done', 'timed_out', 'cancelled', 'expired'));
DROP INDEX bus_deliveries_finished;
CREATE INDEX bus_deliveries_finished ON bus_deliveries (updated_at)
    WHERE status IN ('done', 'failed', 'expired');
-- The staleness sweep: messages and tasks between employees not yet handed to their entity.
CREATE INDEX bus_deliveries_ipc_waiting ON bus_deliveries (ingress_received_at)
    WHERE status IN ('pending', 'held') AND type IN ('eventos.ipc.message', 'eventos.ipc.task');

CREATE OR REPLACE FUNCTION timeline_deliveries_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, at, kind, thread, chains, ref, detail)
    SELECT split_part(n.stream_key, '/', 1), clock_timestamp(),
           CASE n.status WHEN 'delivered' THEN 'input.delivered' WHEN 'dead' THEN 'input.dead'
                         WHEN 'pending' THEN 'input.pending' WHEN 'expired' THEN 'input.expired'
                         ELSE 'input.skipped' END,
           n.thread, ARRAY[n.chain_id], n.id::text,
           jsonb_build_object('seq', n.seq, 'class', n.class, 'attempts', n.attempts,
                              'reason', left(split_part(n.reason, ':', 1), 80))
    FROM moved_to n JOIN moved_from o ON o.id = n.id
    WHERE o.status IS DISTINCT FROM n.status
      AND (n.status IN ('delivered', 'dead', 'pending', 'expired')
           OR (n.status = 'done' AND n.reason LIKE 'skipped:%'));
    RETURN NULL;
END
$$;
