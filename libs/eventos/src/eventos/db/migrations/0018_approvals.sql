-- Approvals (issue 14, SPEC §11): a send or a tool call that needs the owner's approval waits
-- on an approval row (a held send's outbox row is `held`). The decision is written here first (with its place in the decision order),
-- then an intent nudges the ApprovalWorkflow; `taken_at` says the decision was acted on (the
-- send released, or the row settled), once.
CREATE SEQUENCE approvals_decision_seq;
CREATE TABLE approvals (
    id            text PRIMARY KEY,
    employee      text NOT NULL,
    generation    integer NOT NULL,
    thread        text NOT NULL,
    turn_id       text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('send', 'tool')),
    outbound_id   bigint UNIQUE REFERENCES outbound_messages (id),  -- a send's
    tool_call     text UNIQUE,  -- a tool call's key (`<turn>:<call id>`)
    draft         text,  -- a tool call's name and arguments, shown to whoever decides
    audience      text,  -- the user whose chat it answers (who may decide it, with the admin)
    state         text NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'approved', 'declined', 'expired')),
    expires_at    timestamptz NOT NULL,
    reminded_at   timestamptz,
    decided_at    timestamptz,
    decided_by    text,
    decision_seq  bigint,
    taken_at      timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX approvals_open ON approvals (employee, state) WHERE taken_at IS NULL;

ALTER TABLE intents DROP CONSTRAINT intents_kind_check;
ALTER TABLE intents ADD CONSTRAINT intents_kind_check
    CHECK (kind IN ('start', 'stop', 'resume', 'reset', 'interrupt', 'limits', 'rearm',
                    'approval'));
