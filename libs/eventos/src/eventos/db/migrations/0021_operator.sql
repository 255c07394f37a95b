-- Operator surfaces (issue 16): dead letters and their replay; attention items acknowledged.

-- A replay (SPEC §5 `replay(selector)`) is a new ingress row in the original's source under its
-- own dedupe key (`replay:<letter id>`), naming the letter it replays (`replay_of`). A dead
-- delivery goes back to the one trigger it died in (`replay_employee`, `replay_trigger`: that
-- employee's live generation), not to every subscriber of its source anew. The letter records
-- when it was replayed and as which row, so nothing is replayed twice.
ALTER TABLE bus_ingress
    ADD COLUMN replay_of text,
    ADD COLUMN replay_employee text,
    ADD COLUMN replay_trigger text,
    ADD COLUMN replayed_at timestamptz,
    ADD COLUMN replayed_as bigint;
ALTER TABLE bus_deliveries
    ADD COLUMN replayed_at timestamptz,
    ADD COLUMN replayed_as bigint;
-- The dead letters, newest first (an ingress row died when it was routed, else on arrival).
CREATE INDEX bus_ingress_dead ON bus_ingress ((coalesce(routed_at, received_at)), id)
    WHERE status = 'dead';
CREATE INDEX bus_deliveries_dead ON bus_deliveries (updated_at, id) WHERE status = 'dead';

-- Attention items may be acknowledged: `acked` stays listed until resolved, and a repeat
-- counts on it as on an open one (the unique index covers both states, so every raise's
-- `ON CONFLICT (kind, ref) WHERE state = 'open'` lands on the acked row too).
ALTER TABLE attention_items DROP CONSTRAINT attention_items_state_check;
ALTER TABLE attention_items ADD CONSTRAINT attention_items_state_check
    CHECK (state IN ('open', 'acked', 'resolved'));
ALTER TABLE attention_items
    ADD COLUMN acked_at timestamptz,
    ADD COLUMN acked_by text,
    ADD COLUMN resolved_at timestamptz,
    ADD COLUMN resolved_by text;  -- NULL: its cause went away (or an action settled it)
DROP INDEX attention_items_open;
CREATE UNIQUE INDEX attention_items_open ON attention_items (kind, ref)
    WHERE state IN ('open', 'acked');
-- The attention list, newest first, by state.
CREATE INDEX attention_items_listed ON attention_items (state, id);
