-- name: backup_migration_level
-- The highest migration applied to the database a backup dumps (its schema).
SELECT coalesce(max(version), 0) AS level FROM schema_migrations;

-- name: restore_streams_sent
-- Streams whose entity was sent inputs it had not consumed when the backup was taken (a
-- restore gives them back to the relay, whatever Temporal holds).
SELECT stream_key FROM bus_streams WHERE delivered_seq > consumed_seq;


-- name: restore_sends_made
-- Channel sends of the live database that may have reached their provider, changed since
-- `since` (a restore carries their keys into the restored database: nothing is sent twice).
SELECT to_jsonb(o) - 'id' AS row FROM outbound_messages o
WHERE o.kind <> 'chat' AND o.updated_at >= %(since)s
  AND (o.status IN ('sent', 'unknown') OR o.provider_called_at IS NOT NULL)
ORDER BY o.id;

-- name: restore_send_keep
-- One such send in the restored database: added when it has no row of that key, its outcome
-- taken when its row there was not sent yet (a re-run turn's save then finds the key taken
-- and its send finds nothing to claim).
INSERT INTO outbound_messages (idempotency_key, employee, thread, turn_id, account, recipient,
    recipient_key_id, kind, class, body, body_ref, status, approval_id, held_reason, not_before,
    claim_token, provider_called_at, provider_message_id, receipt, audience, claimed_at, error,
    retry_requested_at, attempts, created_at, updated_at)
SELECT idempotency_key, employee, thread, turn_id, account, recipient, recipient_key_id, kind,
    class, body, body_ref, status, NULL, held_reason, not_before, claim_token,
    provider_called_at, provider_message_id, receipt, audience, claimed_at, error,
    retry_requested_at, attempts, created_at, updated_at
FROM jsonb_populate_record(NULL::outbound_messages, %(row)s)
ON CONFLICT (idempotency_key) DO UPDATE
SET status = EXCLUDED.status, provider_called_at = EXCLUDED.provider_called_at,
    provider_message_id = EXCLUDED.provider_message_id, receipt = EXCLUDED.receipt,
    error = EXCLUDED.error, claim_token = EXCLUDED.claim_token,
    claimed_at = EXCLUDED.claimed_at, attempts = EXCLUDED.attempts, updated_at = now()
WHERE outbound_messages.status IN ('held', 'queued', 'sending')
RETURNING id;
