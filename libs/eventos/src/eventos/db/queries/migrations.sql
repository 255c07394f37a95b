-- name: migration_lock
-- Serialize migrators across processes.
SELECT pg_advisory_lock(%(key)s);

-- name: migration_unlock
-- Release the migrators' lock.
SELECT pg_advisory_unlock(%(key)s);

-- name: migration_table_create
-- The ledger of applied migrations.
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: migration_list
-- Applied migrations.
SELECT version, checksum FROM schema_migrations ORDER BY version;

-- name: migration_record
-- Record one applied migration.
INSERT INTO schema_migrations (version, name, checksum) VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: partition_list
-- The daily partitions of bus_ingress.
SELECT c.relname AS name
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname = 'bus_ingress' AND c.relname LIKE 'bus\_ingress\_p%%'
ORDER BY c.relname;
