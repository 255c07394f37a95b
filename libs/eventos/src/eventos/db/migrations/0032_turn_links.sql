-- The console links a dead letter to its turn (issue 26): a delivery dead-lettered because its
-- turn failed twice keeps that turn's id. No rewrite: a nullable column, set only then.
ALTER TABLE bus_deliveries ADD COLUMN turn_id text;
