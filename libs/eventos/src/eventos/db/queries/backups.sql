-- name: backup_migration_level
-- The highest migration applied to the database a backup dumps (its schema).
SELECT coalesce(max(version), 0) AS level FROM schema_migrations;

-- name: restore_streams_sent
-- Streams whose entity was sent inputs it had not consumed when the backup was taken (a
-- restore gives them back to the relay, whatever Temporal holds).
SELECT stream_key FROM bus_streams WHERE delivered_seq > consumed_seq;

