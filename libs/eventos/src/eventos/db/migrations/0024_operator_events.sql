-- The operator event stream (issue 16 point 5; docs/events.md) and the chat stream's places.
--
-- An event row is written beside the state change it tells, in the same transaction, without
-- a place in the stream (`pos` NULL). One sequencer (eventos.event_positions), under an
-- advisory lock, gives committed rows their places from `event_positions` in a transaction of
-- its own; readers read `pos > last`. A row still uncommitted is invisible to the sequencer, so
-- it takes a place after every place given before it commits: a reader that resumed past
-- later events still gets it, once. Ids alone (`id > last`) would skip it: an identity value
-- is taken at insert, and rows commit out of that order.
CREATE SEQUENCE event_positions;

CREATE TABLE operator_events (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pos       bigint UNIQUE,  -- its place in the stream; NULL until the sequencer gives it one
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    employee  text NOT NULL,
    audience  text,  -- the user whose chat it is about (they see it too); NULL: the admin's
    kind      text NOT NULL,  -- `<family>.<what>`: turn.done, outbox.sent, attention.acked, …
    ref       text NOT NULL,  -- the id of what changed (turn, outbox row, item, approval, …)
    state     text,
    detail    jsonb NOT NULL DEFAULT '{}'  -- ids, codes and counts; never message text
);
-- The sequencer's work: rows without a place, oldest first.
CREATE INDEX operator_events_unplaced ON operator_events (id) WHERE pos IS NULL;
-- The retention sweep (7 days), oldest first.
CREATE INDEX operator_events_age ON operator_events USING brin (at);

-- Every place at or below `through` may be gone (7 days' retention): a reader resuming from
-- below it is told so (410) instead of missing what went.
CREATE TABLE operator_events_pruned (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    through  bigint NOT NULL DEFAULT 0
);
INSERT INTO operator_events_pruned DEFAULT VALUES;

-- Chat events take places from the same sequencer; the stream reads by place (was: by id,
-- which skipped a reply committed after a later run event).
ALTER TABLE chat_events ADD COLUMN pos bigint UNIQUE;
UPDATE chat_events c SET pos = p.pos
FROM (SELECT id, nextval('event_positions') AS pos FROM (SELECT id FROM chat_events ORDER BY id) q) p
WHERE c.id = p.id;
DROP INDEX chat_events_session;
CREATE INDEX chat_events_session ON chat_events (employee, audience, session, pos);
CREATE INDEX chat_events_unplaced ON chat_events (id) WHERE pos IS NULL;

-- A committed event wakes the sequencer (a hint: it also looks every few seconds).
CREATE FUNCTION operator_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('eventos_operator_events', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER operator_events_notify AFTER INSERT ON operator_events
    FOR EACH STATEMENT EXECUTE FUNCTION operator_events_notify();

-- Turns, outbox rows, dead deliveries and raised attention items: told by the timeline's
-- entries (written by its triggers, 0022), so no second trigger sits on turns, the outbox or
-- bus_deliveries. The WHEN clause keeps the router's and the relay's entries (accepted,
-- routed, delivered) out of the function; a user's chat thread makes the event theirs too.
CREATE FUNCTION operator_event_from_timeline() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    family text := split_part(NEW.kind, '.', 1);
    what text := split_part(NEW.kind, '.', 2);
    -- The outbox row's or the item's id; never a cast that could fail the writer's statement.
    row_id bigint := CASE WHEN NEW.ref ~ '^[0-9]{1,18}$' THEN NEW.ref::bigint END;
BEGIN
    INSERT INTO operator_events (employee, audience, kind, ref, state, detail)
    SELECT NEW.employee,
           CASE family
               WHEN 'reply' THEN (SELECT o.audience FROM outbound_messages o WHERE o.id = row_id)
               WHEN 'attention' THEN (SELECT a.audience FROM attention_items a
                                      WHERE a.id = row_id)
               ELSE (SELECT u.name FROM users u WHERE u.thread = NEW.thread)
           END,
           CASE family WHEN 'reply' THEN 'outbox.' || what
                       WHEN 'input' THEN 'dead_letter.added' ELSE NEW.kind END,
           CASE family WHEN 'input' THEN 'delivery-' || NEW.ref ELSE NEW.ref END,
           CASE family WHEN 'attention' THEN 'open' WHEN 'input' THEN 'dead' ELSE what END,
           NEW.detail;
    RETURN NULL;
END
$$;
CREATE TRIGGER employee_timeline_operator_events AFTER INSERT ON employee_timeline
    FOR EACH ROW WHEN (NEW.kind LIKE 'turn.%' OR NEW.kind LIKE 'reply.%'
                       OR NEW.kind IN ('input.dead', 'attention.raised'))
    EXECUTE FUNCTION operator_event_from_timeline();

-- An attention item acknowledged or resolved (raised: from the timeline above).
CREATE FUNCTION operator_event_attention() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operator_events (employee, audience, kind, ref, state, detail)
    VALUES (NEW.employee, NEW.audience, 'attention.' || NEW.state, NEW.id::text, NEW.state,
            jsonb_build_object('attention', NEW.kind, 'severity', NEW.severity,
                               'by', CASE NEW.state WHEN 'acked' THEN NEW.acked_by
                                                    ELSE NEW.resolved_by END));
    RETURN NULL;
END
$$;
CREATE TRIGGER attention_items_operator_events AFTER UPDATE OF state ON attention_items
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION operator_event_attention();

-- An approval created, decided (approved, declined) or expired; never its draft.
CREATE FUNCTION operator_event_approval() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operator_events (employee, audience, kind, ref, state, detail)
    VALUES (NEW.employee, NEW.audience,
            CASE WHEN TG_OP = 'INSERT' THEN 'approval.created'
                 WHEN NEW.state = 'expired' THEN 'approval.expired'
                 ELSE 'approval.decided' END,
            NEW.id, NEW.state,
            jsonb_build_object('approval_kind', NEW.kind, 'generation', NEW.generation,
                               'outbound', NEW.outbound_id, 'expires_at', NEW.expires_at,
                               'by', NEW.decided_by));
    RETURN NULL;
END
$$;
CREATE TRIGGER approvals_operator_events_added AFTER INSERT ON approvals
    FOR EACH ROW EXECUTE FUNCTION operator_event_approval();
CREATE TRIGGER approvals_operator_events_moved AFTER UPDATE OF state ON approvals
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION operator_event_approval();

-- A generation's state: starting, running, paused (with its reason), retired.
CREATE FUNCTION operator_event_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operator_events (employee, kind, ref, state, detail)
    VALUES (NEW.employee, 'employee.' || NEW.state, NEW.generation::text, NEW.state,
            jsonb_build_object('generation', NEW.generation, 'pause_reason', NEW.pause_reason));
    RETURN NULL;
END
$$;
CREATE TRIGGER generations_operator_events_added AFTER INSERT ON generations
    FOR EACH ROW EXECUTE FUNCTION operator_event_generation();
CREATE TRIGGER generations_operator_events_moved AFTER UPDATE OF state ON generations
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION operator_event_generation();

-- An employee became degraded, or recovered (by itself or by the owner's clear).
CREATE FUNCTION operator_event_health() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operator_events (employee, kind, ref, state, detail)
    VALUES (NEW.employee,
            CASE WHEN NEW.degraded_since IS NULL THEN 'employee.recovered'
                 ELSE 'employee.degraded' END,
            NEW.employee,
            CASE WHEN NEW.degraded_since IS NULL THEN 'recovered' ELSE 'degraded' END,
            jsonb_build_object('reason', NEW.reason,
                               'by', CASE WHEN NEW.degraded_since IS NULL THEN NEW.cleared_by END));
    RETURN NULL;
END
$$;
CREATE TRIGGER employee_health_operator_events_added AFTER INSERT ON employee_health
    FOR EACH ROW WHEN (NEW.degraded_since IS NOT NULL)
    EXECUTE FUNCTION operator_event_health();
CREATE TRIGGER employee_health_operator_events_moved AFTER UPDATE OF degraded_since
    ON employee_health
    FOR EACH ROW WHEN ((OLD.degraded_since IS NULL) <> (NEW.degraded_since IS NULL))
    EXECUTE FUNCTION operator_event_health();
