-- Private data (issue 11): the outbox recipient encrypted at rest.
-- `recipient` becomes nonce ‖ AES-GCM ciphertext (sealed by the services, which hold the keys;
-- SQL never sees one), with the id of the key that sealed it. Rows written before held a
-- plaintext recipient, and only owner chat wrote one (its session name). A migration cannot
-- seal, so none is kept: a settled row loses it (nothing reads it again), an open reply to the
-- default session `owner` loses nothing (NULL means `owner`), and an open reply to any other
-- session is expired rather than shown to the wrong session. The type change rewrites the
-- table, so the old values do not linger in its pages either.
UPDATE outbound_messages SET status = 'expired', updated_at = now()
WHERE recipient IS NOT NULL AND recipient <> 'owner'
  AND status IN ('held', 'queued', 'sending', 'unknown');
ALTER TABLE outbound_messages ALTER COLUMN recipient TYPE bytea USING NULL;
ALTER TABLE outbound_messages ADD COLUMN recipient_key_id text;
ALTER TABLE outbound_messages ADD CONSTRAINT outbound_messages_recipient_sealed
    CHECK ((recipient IS NULL) = (recipient_key_id IS NULL));
