-- name: watch_pending_open
-- The delivery still standing for (subscription, subject), if it can take one more change:
-- not yet sent (`pending`/`held`) and its stream not leased by a relay right now (a relay
-- between reading a batch and committing `delivered` may have handed it to a turn already,
-- and that turn may have read the record before this change).
SELECT w.stream_key, w.seq
FROM watch_pending w
JOIN bus_deliveries d ON d.stream_key = w.stream_key AND d.seq = w.seq
WHERE w.subscription_id = %(subscription_id)s AND w.subject = %(subject)s
  AND d.status IN ('pending', 'held')
  AND NOT EXISTS (SELECT 1 FROM bus_leases l
                  WHERE l.name = 'relay:' || w.stream_key AND l.until > now());

-- name: watch_pending_coalesce
-- Count one more change on the delivery standing for (subscription, subject).
UPDATE watch_pending
SET coalesced = coalesced + 1, last_version = %(version)s, updated_at = now()
WHERE subscription_id = %(subscription_id)s AND subject = %(subject)s
RETURNING coalesced;

-- name: watch_pending_prune
-- Forget a subscription's subjects whose delivery has been sent (or settled).
DELETE FROM watch_pending w
WHERE w.subscription_id = %(subscription_id)s AND NOT EXISTS (
    SELECT 1 FROM bus_deliveries d
    WHERE d.stream_key = w.stream_key AND d.seq = w.seq AND d.status IN ('pending', 'held'));

-- name: watch_pending_subjects
-- How many record keys of a subscription have a delivery still pending (after a prune).
SELECT count(*) AS n FROM watch_pending
WHERE subscription_id = %(subscription_id)s AND subject <> %(resync)s;

-- name: watch_pending_set
-- The delivery that now stands for (subscription, subject).
INSERT INTO watch_pending (subscription_id, subject, stream_key, seq, last_version)
VALUES (%(subscription_id)s, %(subject)s, %(stream_key)s, %(seq)s, %(version)s)
ON CONFLICT (subscription_id, subject) DO UPDATE
    SET stream_key = EXCLUDED.stream_key, seq = EXCLUDED.seq, coalesced = 0,
        last_version = EXCLUDED.last_version, updated_at = now();
