-- Users and audiences (issue 11).
-- A user of the owner API: its token is shown once and only its sha256 is kept; its owner chat
-- is its own conversation, on thread `thread` (`u_` and 16 hex of a hash of the name).
CREATE TABLE users (
    name          text PRIMARY KEY,
    thread        text NOT NULL UNIQUE,
    token_sha256  text NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Owner chat belongs to an audience: a user's name, or `owner` (the admin). Sessions are per
-- audience, so two users' same session name and client id never meet.
ALTER TABLE chat_messages ADD COLUMN audience text NOT NULL DEFAULT 'owner';
ALTER TABLE chat_messages DROP CONSTRAINT chat_messages_employee_session_client_message_id_key;
ALTER TABLE chat_messages ADD CONSTRAINT chat_messages_client_id
    UNIQUE (employee, audience, session, client_message_id);
DROP INDEX chat_messages_pending;
CREATE INDEX chat_messages_pending ON chat_messages (employee, audience, session)
    WHERE status = 'queued';
ALTER TABLE chat_events ADD COLUMN audience text NOT NULL DEFAULT 'owner';
DROP INDEX chat_events_session;
CREATE INDEX chat_events_session ON chat_events (employee, audience, session, id);

-- Approvals (held outbox rows) and attention items carry their audience: the user whose chat
-- they came from (who sees them besides the admin), or NULL for the admin alone.
ALTER TABLE outbound_messages ADD COLUMN audience text;
ALTER TABLE attention_items ADD COLUMN audience text;
