-- Retention as SPEC §15 says (docs/dead-letters.md "Retention"): deliveries 30 days, dead
-- letters 90 days, whatever the 7-day ingress partitions do.
--
-- A dead ingress row outlives its daily partition: before the upkeep drops a partition it
-- moves the partition's dead rows here, the default partition of bus_ingress, where they stay
-- until 90 days after they died. Being a partition, the dead-letter list, its cursor and the
-- replay read and claim them as any other ingress row, by the same queries and indexes. Only
-- dead rows may land here: a row of a day without its daily partition is still refused.
CREATE TABLE bus_ingress_kept PARTITION OF bus_ingress DEFAULT;
ALTER TABLE bus_ingress_kept ADD CONSTRAINT bus_ingress_kept_dead CHECK (status = 'dead');
-- The body sweep keeps a body while a dead ingress row refers to it (replayable).
CREATE INDEX bus_ingress_dead_body_ref ON bus_ingress (body_ref)
    WHERE status = 'dead' AND body_ref IS NOT NULL;
-- The delivery sweep: finished deliveries past 30 days, oldest first (dead ones, past 90
-- days, through bus_deliveries_dead).
CREATE INDEX bus_deliveries_finished ON bus_deliveries (updated_at)
    WHERE status IN ('done', 'failed');
