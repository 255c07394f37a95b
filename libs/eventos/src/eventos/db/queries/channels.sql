-- name: instance_secret_create
-- Make an instance value once (a replica that loses the race keeps the first one).
INSERT INTO instance_secrets (name, value) VALUES (%(name)s, %(value)s)
ON CONFLICT (name) DO NOTHING;

-- name: instance_secret_get
-- One instance value.
SELECT value FROM instance_secrets WHERE name = %(name)s;

-- name: channel_accounts_wanted
-- The channel accounts a running generation subscribes to (a reader runs only for these).
SELECT DISTINCT s.source_key AS id, s.trigger_kind AS driver
FROM bus_subscriptions s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE g.state = 'running' AND s.trigger_kind = ANY(%(drivers)s)
ORDER BY s.source_key;

-- name: channel_account_upsert
-- An account's row, made when a running generation first subscribes to it.
INSERT INTO channel_accounts (id, driver, credential_ref)
VALUES (%(id)s, %(driver)s, %(credential_ref)s)
ON CONFLICT (id) DO NOTHING;

-- name: channel_account_acquire
-- Take or renew an account's read lease; a new holder gets the next fencing token.
UPDATE channel_accounts
SET fencing = CASE WHEN lease_owner = %(owner)s AND lease_until > now() THEN fencing
                   ELSE fencing + 1 END,
    lease_owner = %(owner)s, lease_until = now() + make_interval(secs => %(ttl_s)s),
    updated_at = now()
WHERE id = %(id)s AND (lease_owner IS NULL OR lease_until <= now() OR lease_owner = %(owner)s)
RETURNING fencing, cursor;

-- name: channel_account_release
-- Give a read lease back (the account is no longer wanted here, or the reader stops).
UPDATE channel_accounts
SET lease_owner = NULL, lease_until = NULL, status = 'idle', updated_at = now()
WHERE id = %(id)s AND lease_owner = %(owner)s;

-- name: channel_account_fence
-- Lock the account for a reader's append; no row: its lease was lost (nothing is written).
SELECT cursor, down_since FROM channel_accounts
WHERE id = %(id)s AND lease_owner = %(owner)s AND fencing = %(fencing)s AND lease_until > now()
FOR UPDATE;

-- name: channel_account_read
-- A read committed with its events: the cursor, up, seen now.
UPDATE channel_accounts
SET cursor = %(cursor)s, status = 'up', down_since = NULL, error = NULL, last_seen_at = now(),
    updated_at = now()
WHERE id = %(id)s AND lease_owner = %(owner)s AND fencing = %(fencing)s;

-- name: channel_account_down
-- A failed read: down since the first failure in a row, with the last error; how long.
UPDATE channel_accounts
SET status = 'down', down_since = coalesce(down_since, now()), error = %(error)s,
    updated_at = now()
WHERE id = %(id)s AND lease_owner = %(owner)s AND fencing = %(fencing)s
RETURNING extract(epoch FROM now() - down_since)::float8 AS down_s;

-- name: channel_account_get
-- One account's row.
SELECT id, driver, external_id, status, cursor, lease_owner, lease_until, fencing, down_since,
    error, last_seen_at
FROM channel_accounts WHERE id = %(id)s;

-- name: channel_item_raise
-- An account's item (down too long, past its backlog bound): one open item per account (the
-- attention key is (kind, ref)), on the first employee by name whose running generation reads
-- it; raised again while it stays open: counted, detail updated.
INSERT INTO attention_items (employee, kind, severity, ref, detail)
SELECT s.employee, %(kind)s, %(severity)s, %(id)s, %(detail)s
FROM bus_subscriptions s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE g.state = 'running' AND s.source_key = %(id)s
ORDER BY s.employee LIMIT 1
ON CONFLICT (kind, ref) WHERE state = 'open' DO UPDATE
    SET count = attention_items.count + 1, last_seen = now(), detail = EXCLUDED.detail;

-- name: egress_bucket_open
-- A send bucket, full on first use, locked for the rest of the transaction (the caller opens
-- a send's buckets in key order, so two sends never deadlock).
INSERT INTO egress_buckets (key, tokens, refilled_at) VALUES (%(key)s, %(burst)s, now())
ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key
RETURNING tokens, extract(epoch FROM now() - refilled_at)::float8 AS elapsed_s,
    greatest(extract(epoch FROM paused_until - now()), 0)::float8 AS paused_s;

-- name: egress_bucket_save
-- A bucket's level after a refill (and a take).
UPDATE egress_buckets SET tokens = %(tokens)s, refilled_at = now() WHERE key = %(key)s;

-- name: egress_bucket_pause
-- A provider's 429: nothing leaves through this bucket until its retry hint has passed.
INSERT INTO egress_buckets (key, tokens, refilled_at, paused_until)
VALUES (%(key)s, 0, now(), now() + make_interval(secs => %(pause_s)s))
ON CONFLICT (key) DO UPDATE
    SET tokens = 0, refilled_at = now(),
        paused_until = greatest(egress_buckets.paused_until, EXCLUDED.paused_until);

-- name: outbound_open_ahead
-- How many open sends of the account are older than this one (the high water's measure).
SELECT count(*) AS n FROM outbound_messages
WHERE account = %(account)s AND status IN ('queued', 'sending') AND id < %(id)s;

-- name: outbound_calling
-- Just before the provider is called: from here on, a broken-off attempt may have sent.
UPDATE outbound_messages SET provider_called_at = clock_timestamp(), updated_at = now()
WHERE id = %(id)s AND status = 'sending' AND claim_token = %(token)s;

-- name: outbound_reclaim
-- Take over an expired claim whose provider was never called (nothing was sent), or whose
-- provider deduplicates on the idempotency key (resending is safe).
UPDATE outbound_messages
SET claim_token = %(token)s, claimed_at = now(), provider_called_at = NULL,
    attempts = attempts + 1, updated_at = now()
WHERE id = %(id)s AND status = 'sending' AND claim_token IS NOT DISTINCT FROM %(old)s
  AND (provider_called_at IS NULL OR %(idempotent)s)
RETURNING id;

-- name: outbound_delivered
-- The provider took the send: sent, with its message id.
UPDATE outbound_messages
SET status = 'sent', provider_message_id = %(provider_message_id)s, error = NULL,
    updated_at = now()
WHERE id = %(id)s AND status = 'sending' AND claim_token = %(token)s;

-- name: outbound_refused
-- The provider refused for good (nothing was sent): failed, with its reason.
UPDATE outbound_messages
SET status = 'failed', error = %(error)s, updated_at = now()
WHERE id = %(id)s AND status = 'sending' AND claim_token = %(token)s;

-- name: outbound_unknown
-- A call that may or may not have sent: `unknown`, never resent on its own.
UPDATE outbound_messages
SET status = 'unknown', error = %(error)s, updated_at = now()
WHERE id = %(id)s AND status = 'sending' AND claim_token = %(token)s;

-- name: outbound_retry_request
-- The owner's Retry of an `unknown` or `failed` send, or of one its channel held (the
-- WhatsApp window; never one that waits for an approval): queued again, dated, for the
-- egress to send once.
UPDATE outbound_messages
SET status = 'queued', claim_token = NULL, claimed_at = NULL, provider_called_at = NULL,
    retry_requested_at = now(), updated_at = now()
WHERE id = %(id)s
  AND (status IN ('unknown', 'failed') OR (status = 'held' AND approval_id IS NULL))
RETURNING id, employee;

-- name: outbound_retries_due
-- Sends the owner retried, oldest request first.
SELECT id FROM outbound_messages
WHERE status = 'queued' AND retry_requested_at IS NOT NULL
ORDER BY retry_requested_at LIMIT %(limit)s;

-- name: outbound_list
-- The outbox, newest first, optionally of one status and one employee (never a recipient).
SELECT id, employee, thread, turn_id, kind, account, class, status, held_reason, error,
    provider_message_id, receipt, created_at, updated_at, provider_called_at,
    retry_requested_at
FROM outbound_messages
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(employee)s::text IS NULL OR employee = %(employee)s)
  AND (%(audience)s::text IS NULL OR audience = %(audience)s)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC LIMIT %(limit)s;

-- name: statement_timeout_local
-- A tighter statement timeout for the rest of this transaction (Discord's 3 s answer window).
SELECT set_config('statement_timeout', %(ms)s, true);

-- name: channel_account_routable
-- Whether a generation that routes events (starting, running, paused) subscribes to an account.
SELECT EXISTS (
    SELECT 1 FROM bus_subscriptions s
    JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
    WHERE s.source_key = %(id)s AND g.state = ANY(%(states)s::text[])
) AS routable;

-- name: channel_backlog
-- An account's customer inputs not yet consumed (SPEC §15: 5,000 per account), counted up to
-- the cap: its accepted, unrouted rows (index bus_ingress_accepted) and the open deliveries
-- of the live generations subscribing to it (index bus_deliveries_open_by_subscription).
SELECT count(*) AS n FROM (
    SELECT 1 FROM (
        (SELECT 1 FROM bus_ingress WHERE status = 'accepted' AND source_key = %(source_key)s
         LIMIT %(cap)s)
        UNION ALL
        (SELECT 1 FROM bus_deliveries d
         WHERE d.status IN ('pending', 'held', 'delivered') AND d.subscription_id IN (
             SELECT s.id FROM bus_subscriptions s
             JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
             WHERE s.source_key = %(source_key)s AND g.state <> 'retired')
         LIMIT %(cap)s)
    ) u LIMIT %(cap)s
) t;
