-- Conversations, turns, admission leases, the outbox and owner chat replies (SPEC §8, §9, §11).

CREATE TABLE conversations (
    employee          text NOT NULL,
    generation        integer NOT NULL,
    agent             text NOT NULL,
    thread            text NOT NULL,
    stream_key        text NOT NULL REFERENCES bus_streams (stream_key),
    transcript        jsonb NOT NULL DEFAULT '[]',
    transcript_bytes  integer NOT NULL DEFAULT 0,
    next_turn         integer NOT NULL DEFAULT 1,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (employee, generation, agent, thread),
    FOREIGN KEY (employee, generation) REFERENCES generations (employee, generation)
);

CREATE TABLE turns (
    id            text PRIMARY KEY,
    employee      text NOT NULL,
    generation    integer NOT NULL,
    agent         text NOT NULL,
    thread        text NOT NULL,
    n             integer NOT NULL,
    class         smallint NOT NULL,
    stream_key    text NOT NULL,
    status        text NOT NULL DEFAULT 'running'
                  CHECK (status IN ('running', 'done', 'failed', 'cancelled')),
    consumed_seq  bigint,
    started_at    timestamptz NOT NULL DEFAULT now(),
    ended_at      timestamptz,
    error         text,
    UNIQUE (employee, generation, agent, thread, n)
);

-- Admission (SPEC §9): one row per admitted turn while it holds a slot.
CREATE TABLE sched_leases (
    turn_id     text PRIMARY KEY,
    employee    text NOT NULL,
    class       smallint NOT NULL,
    state       text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended')),
    granted_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sched_leases_active ON sched_leases (employee) WHERE state = 'active';

CREATE TABLE outbound_messages (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key      text NOT NULL UNIQUE,
    employee             text NOT NULL,
    thread               text NOT NULL,
    turn_id              text NOT NULL,
    account              text,
    recipient            text,
    kind                 text NOT NULL,
    class                smallint NOT NULL,
    body                 text,
    body_ref             text,
    status               text NOT NULL DEFAULT 'queued'
                         CHECK (status IN ('held', 'queued', 'sending', 'sent', 'failed', 'unknown',
                                           'expired')),
    approval_id          text,
    held_reason          text,
    not_before           timestamptz,
    claim_token          text,
    provider_called_at   timestamptz,
    provider_message_id  text,
    receipt              jsonb,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbound_messages_open ON outbound_messages (status) WHERE status IN ('queued', 'sending');

ALTER TABLE chat_messages ADD COLUMN turn_id text;

CREATE TABLE chat_replies (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    employee     text NOT NULL,
    session      text NOT NULL,
    outbound_id  bigint NOT NULL UNIQUE REFERENCES outbound_messages (id),
    turn_id      text NOT NULL,
    text         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX chat_replies_session ON chat_replies (employee, session, id);
