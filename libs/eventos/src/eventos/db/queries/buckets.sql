-- name: credential_pause_get
-- Until when a credential is paused (a 429 with Retry-After pauses it for every class).
SELECT until FROM provider_pauses WHERE credential = %(credential)s AND until > %(now)s;

-- name: credential_pause
-- Pause a credential for every class (the later of two pauses wins).
INSERT INTO provider_pauses (credential, until, reason)
VALUES (%(credential)s, %(until)s, %(reason)s)
ON CONFLICT (credential) DO UPDATE
    SET until = greatest(provider_pauses.until, EXCLUDED.until), reason = EXCLUDED.reason;

-- name: bucket_open
-- A class's bucket for a credential, full on first use, locked for the rest of the transaction.
INSERT INTO provider_buckets (credential, class, requests, tokens, refilled_at)
VALUES (%(credential)s, %(class)s, %(rpm)s, %(tpm)s, %(now)s)
ON CONFLICT (credential, class) DO UPDATE SET credential = EXCLUDED.credential
RETURNING requests, tokens, refilled_at;

-- name: bucket_save
-- The bucket's levels after a refill and a take.
UPDATE provider_buckets SET requests = %(requests)s, tokens = %(tokens)s, refilled_at = %(now)s
WHERE credential = %(credential)s AND class = %(class)s;
