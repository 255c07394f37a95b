-- name: whatsapp_account_subscribed
-- Whether a running generation subscribes to this WhatsApp account (its webhook answers 404
-- otherwise).
SELECT 1 AS subscribed
FROM bus_subscriptions s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE g.state = 'running' AND s.source_key = %(source_key)s
LIMIT 1;

-- name: whatsapp_window_touch
-- A customer wrote: the window opens at the message's time (never moved back by a late
-- redelivery of an older message), and its id is what a reply answers.
INSERT INTO whatsapp_windows AS w (account, counterpart, last_inbound_at, last_wamid)
VALUES (%(account)s, %(counterpart)s, %(at)s, %(wamid)s)
ON CONFLICT (account, counterpart) DO UPDATE
    SET last_inbound_at = greatest(w.last_inbound_at, EXCLUDED.last_inbound_at),
        last_wamid = CASE WHEN EXCLUDED.last_inbound_at >= w.last_inbound_at
                          THEN EXCLUDED.last_wamid ELSE w.last_wamid END;

-- name: whatsapp_window_get
-- A customer's window: seconds since their last message, and that message's id.
SELECT extract(epoch FROM now() - last_inbound_at)::float8 AS age_s, last_wamid
FROM whatsapp_windows WHERE account = %(account)s AND counterpart = %(counterpart)s;

-- name: outbound_receipt
-- A delivery status of a sent row, found by its provider message id; a status never moves a
-- receipt back (`read` stays when a late `delivered` arrives). An unknown id updates nothing.
UPDATE outbound_messages
SET receipt = %(receipt)s, updated_at = now()
WHERE provider_message_id = %(provider_message_id)s AND kind = %(kind)s
  AND account = %(account)s
  AND coalesce(array_position(%(order)s::text[], receipt->>'status'), 0)
      <= array_position(%(order)s::text[], %(status)s::text);

-- name: outbound_held
-- The sender held the send without calling the provider (outside WhatsApp's window): held,
-- with its reason, the claim given back.
UPDATE outbound_messages
SET status = 'held', held_reason = %(reason)s, claim_token = NULL, claimed_at = NULL,
    provider_called_at = NULL, updated_at = now()
WHERE id = %(id)s AND status = 'sending' AND claim_token = %(token)s;
