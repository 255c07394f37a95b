-- Users are the owner's guests (SPEC §17, issue 25): each user record has its own id, and its
-- owner-chat thread derives from that id (a name removed and created again starts a new
-- conversation; existing users keep the thread they have). A user's chat runs at class C2
-- unless the admin granted C1, and spends at most `daily_usd` a day per employee (NULL: the
-- documented share of the employee's daily budget, eventos.names.USER_DAILY_SHARE).
ALTER TABLE users ADD COLUMN id uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE;
ALTER TABLE users ADD COLUMN class smallint NOT NULL DEFAULT 2 CHECK (class IN (1, 2));
ALTER TABLE users ADD COLUMN daily_usd numeric(12, 4) CHECK (daily_usd > 0);
-- A user's spend today: the period's spend events, joined to their turns' threads.
CREATE INDEX spend_events_period ON spend_events (employee, period_start);
-- Whether a chat message's reply is held for review (the message's status read).
CREATE INDEX outbound_messages_turn ON outbound_messages (turn_id);
-- A chat message's user record (NULL: the admin's, or a user's from before records had ids): a
-- re-created name's client ids never meet the old holder's.
ALTER TABLE chat_messages ADD COLUMN user_id uuid;
ALTER TABLE chat_messages DROP CONSTRAINT chat_messages_client_id;
CREATE UNIQUE INDEX chat_messages_client_id ON chat_messages (employee, audience, session,
    client_message_id, coalesce(user_id, '00000000-0000-0000-0000-000000000000'::uuid));
