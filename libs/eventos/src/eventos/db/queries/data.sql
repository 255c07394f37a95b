-- name: data_record_get
-- One record of a shared store.
SELECT value, version FROM data_records WHERE store = %(store)s AND key = %(key)s;

-- name: data_record_put
-- Write one record: a new key starts at version 1, every write adds one. `created` says the
-- key is new (its store's key count must take it).
INSERT INTO data_records (store, key, value, version, updated_by)
VALUES (%(store)s, %(key)s, %(value)s, 1, %(writer)s)
ON CONFLICT (store, key) DO UPDATE
    SET value = EXCLUDED.value, version = data_records.version + 1,
        updated_by = EXCLUDED.updated_by, updated_at = now()
RETURNING version, version = 1 AS created;

-- name: data_store_count_key
-- Count a new key on its store (the row lock serializes writers adding keys to one store).
INSERT INTO data_stores (store, keys) VALUES (%(store)s, 1)
ON CONFLICT (store) DO UPDATE SET keys = data_stores.keys + 1
RETURNING keys;

-- name: data_keys_list
-- Keys of a store in bytewise order, optionally under a prefix and after a key (paging); one
-- more than asked says whether there are others.
SELECT key FROM data_records
WHERE store = %(store)s AND starts_with(key, %(prefix)s) AND key > %(after)s
ORDER BY key LIMIT %(limit)s;
