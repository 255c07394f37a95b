-- Hostile input (issue 11): bodies over 64 KB live in the database (they survive a pod), in
-- chunks so no write or read needs a whole body in memory; `storage_path` is kept for an
-- external store and is NULL for bodies held here.
ALTER TABLE event_blobs ALTER COLUMN storage_path DROP NOT NULL;
CREATE INDEX event_blobs_created ON event_blobs (created_at);

CREATE TABLE event_blob_chunks (
    blob_id  text NOT NULL REFERENCES event_blobs (id) ON DELETE CASCADE,
    n        integer NOT NULL CHECK (n >= 0),
    content  bytea NOT NULL,
    PRIMARY KEY (blob_id, n)
);

-- The retention sweep keeps a blob 90 days while a dead delivery refers to it (replayable).
CREATE INDEX bus_deliveries_body_ref ON bus_deliveries (body_ref) WHERE body_ref IS NOT NULL;
