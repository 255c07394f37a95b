-- The owner's chat event stream carries run events besides replies (SPEC §6.2): one ordered
-- table per audience; turns may end `interrupted` (SPEC §8, owner Interrupt).

CREATE TABLE chat_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    employee     text NOT NULL,
    session      text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('run.start', 'run.input_merged', 'reply')),
    turn_id      text NOT NULL,
    -- One event per (kind, turn, inputs) or per outbox row: a retried activity writes nothing.
    dedupe_key   text NOT NULL UNIQUE,
    outbound_id  bigint UNIQUE REFERENCES outbound_messages (id),
    message_ids  bigint[] NOT NULL DEFAULT '{}',
    text         text,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX chat_events_session ON chat_events (employee, session, id);

INSERT INTO chat_events (employee, session, kind, turn_id, dedupe_key, outbound_id, text,
    created_at)
SELECT employee, session, 'reply', turn_id, 'reply:' || outbound_id, outbound_id, text, created_at
FROM chat_replies ORDER BY id;
DROP TABLE chat_replies;

ALTER TABLE turns DROP CONSTRAINT turns_status_check;
ALTER TABLE turns ADD CONSTRAINT turns_status_check
    CHECK (status IN ('running', 'done', 'failed', 'cancelled', 'interrupted'));
