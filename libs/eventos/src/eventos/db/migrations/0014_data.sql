-- Watched data (issue 13 point 7, SPEC §10): named stores shared by the instance's employees.
-- A record is (store, key) → a JSON value with a version that counts its writes (1 on the
-- first); keys sort bytewise ("C") so `data_list` pages the same way everywhere.
CREATE TABLE data_records (
    store       text NOT NULL CHECK (store ~ '^[a-z][a-z0-9-]{0,39}$'),
    key         text COLLATE "C" NOT NULL CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$'),
    value       jsonb NOT NULL,
    version     bigint NOT NULL CHECK (version > 0),
    updated_by  text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store, key)
);
-- One row per store: its key count, the bound's counter (I3). Locked by a write that adds a
-- key, so two writers cannot both take the last free key.
CREATE TABLE data_stores (
    store       text PRIMARY KEY,
    keys        integer NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- The router's coalescing state (level-triggered): per (watch subscription, subject) the
-- delivery that still stands for it. A subject is a record key, or '*' for the store's resync.
-- A row whose delivery has left `pending`/`held` is stale and is replaced or pruned.
CREATE TABLE watch_pending (
    subscription_id  bigint NOT NULL REFERENCES bus_subscriptions (id),
    subject          text COLLATE "C" NOT NULL,
    stream_key       text NOT NULL,
    seq              bigint NOT NULL,
    coalesced        integer NOT NULL DEFAULT 0,
    last_version     bigint,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription_id, subject)
);
