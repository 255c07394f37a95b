-- WhatsApp Business (issue 14): the 24-hour customer-service window. Each customer's last
-- inbound message per account (the customer by its salted hash, never the number), written in
-- the transaction that appends the message; the sender holds a reply outside the window.
CREATE TABLE whatsapp_windows (
    account          text NOT NULL,  -- whatsapp_business:<account>
    counterpart      text NOT NULL,  -- eventos.channels.threads.counterpart_hash
    last_inbound_at  timestamptz NOT NULL,
    last_wamid       text NOT NULL,  -- the reply's context.message_id
    PRIMARY KEY (account, counterpart)
);

-- Delivery statuses find their sent row by the provider's message id.
CREATE INDEX outbound_messages_provider_id ON outbound_messages (provider_message_id)
    WHERE provider_message_id IS NOT NULL;
