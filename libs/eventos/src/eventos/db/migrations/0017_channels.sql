-- Channels and safe egress (issue 14).
-- A channel account (`<driver>:<account>`, the source its events carry) is read by one ingress
-- replica at a time: the lease's fencing token fences every cursor write of a reader that lost
-- it. `down_since` dates an outage (an attention item after 5 minutes).
ALTER TABLE channel_accounts ALTER COLUMN external_id SET DEFAULT '';
ALTER TABLE channel_accounts ADD COLUMN fencing bigint NOT NULL DEFAULT 0;
ALTER TABLE channel_accounts ADD COLUMN down_since timestamptz;
ALTER TABLE channel_accounts ADD COLUMN error text;
ALTER TABLE channel_accounts ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE channel_accounts ADD CONSTRAINT channel_accounts_status
    CHECK (status IN ('idle', 'up', 'down'));

-- Values made once per instance (the salt of customer thread ids), never shown.
CREATE TABLE instance_secrets (
    name        text PRIMARY KEY,
    value       bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Egress token buckets (SPEC §11): one per channel account and one per recipient (keyed by the
-- recipient's salted hash, never the address), shared by every egress replica.
CREATE TABLE egress_buckets (
    key           text PRIMARY KEY,
    tokens        double precision NOT NULL,
    refilled_at   timestamptz NOT NULL,
    paused_until  timestamptz  -- a provider's 429 with a retry hint pauses the whole bucket
);

-- A send's claim is dated (it expires with the activity's attempt), a failure keeps its reason,
-- an owner's Retry of an `unknown` send is dated until the egress sends it, and provider calls
-- are counted (an idempotent provider's unclear answers are retried a few times, then `unknown`).
ALTER TABLE outbound_messages ADD COLUMN claimed_at timestamptz;
ALTER TABLE outbound_messages ADD COLUMN error text;
ALTER TABLE outbound_messages ADD COLUMN retry_requested_at timestamptz;
ALTER TABLE outbound_messages ADD COLUMN attempts integer NOT NULL DEFAULT 0;
CREATE INDEX outbound_messages_retries ON outbound_messages (retry_requested_at)
    WHERE status = 'queued' AND retry_requested_at IS NOT NULL;
CREATE INDEX outbound_messages_account_open ON outbound_messages (account)
    WHERE status IN ('queued', 'sending');
