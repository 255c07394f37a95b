-- Alarms and follow-ups (issue 13, SPEC §10): one row per alarm set by a tool call (`id` a hash
-- of turn and call, so a retried call makes one row) or per deadline another subsystem sets
-- (`kind` deadline, found again by `ref`). The supervisor's one timer covers the earliest
-- `scheduled` row of its generation; `fire_due` moves due rows on by compare-and-swap and appends
-- their inputs in the same transaction. `cancel_on = 'inbound'` rows (follow-ups) are cancelled
-- by the router in the transaction that routes an inbound message to their thread.
CREATE TABLE alarms (
    id           text PRIMARY KEY,
    employee     text NOT NULL,
    generation   integer NOT NULL,
    kind         text NOT NULL DEFAULT 'alarm' CHECK (kind IN ('alarm', 'deadline')),
    ref          text,
    lane         text NOT NULL,
    thread       text NOT NULL,
    route        jsonb NOT NULL,
    agent        text NOT NULL,
    text         text NOT NULL,
    payload      jsonb NOT NULL DEFAULT '{}',
    due_at       timestamptz NOT NULL,
    status       text NOT NULL DEFAULT 'scheduled'
                 CHECK (status IN ('scheduled', 'fired', 'missed', 'cancelled')),
    if_late      text NOT NULL DEFAULT 'fire',
    skip_after_s double precision CHECK (skip_after_s > 0),
    cancel_on    text CHECK (cancel_on IN ('inbound')),
    repeat       jsonb,
    occurrence   integer NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL DEFAULT now(),
    fired_at     timestamptz,
    settled_at   timestamptz,
    chain_id     text NOT NULL,
    hop          integer NOT NULL DEFAULT 0,
    path         jsonb NOT NULL DEFAULT '[]',
    causation_id text
);
-- The supervisor's next deadline and fire_due's batch.
CREATE INDEX alarms_due ON alarms (employee, generation, due_at) WHERE status = 'scheduled';
-- The router's follow-up cancel (one per inbound delivery).
CREATE INDEX alarms_follow_ups ON alarms (employee, generation, lane, thread)
    WHERE status = 'scheduled' AND cancel_on = 'inbound';
-- cancel_by_ref (a deadline's owner settles it).
CREATE INDEX alarms_ref ON alarms (employee, kind, ref) WHERE status = 'scheduled';
