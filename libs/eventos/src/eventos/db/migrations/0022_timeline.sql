-- The employee timeline (SPEC §12, issue 16; docs/timeline.md). One row per thing that
-- happened to an employee's work, written by triggers on the tables that record it, in the
-- transaction that records it: ingress as its deliveries (accepted, routed), the relay's
-- deliveries, turns (with steps, tokens and cost from spend_events), the outbox, alarms,
-- delegated tasks, tool calls and attention items. Never by ingress itself: the append path
-- (EG8) writes no timeline row. `chains` holds the chain ids the entry belongs to (a turn: every
-- input's), `ref` the id of the source row, `detail` small facts (never message text).
-- `at` is when the entry was written (clock_timestamp()), except an input's `accepted` entry,
-- which carries its ingress row's received_at; readers page up to a horizon that no
-- uncommitted entry can fall behind (eventos.timeline.entries). No primary key: nothing looks
-- a row up by id, and each index costs every hot-path write; the retention sweep deletes by
-- `at` (BRIN) 30 days on.
CREATE TABLE employee_timeline (
    id        bigint GENERATED ALWAYS AS IDENTITY,
    employee  text NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind      text NOT NULL,
    thread    text,
    chains    text[] NOT NULL DEFAULT '{}',
    ref       text,
    detail    jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX employee_timeline_at ON employee_timeline (employee, at, id);
CREATE INDEX employee_timeline_thread ON employee_timeline (employee, thread, at, id);
CREATE INDEX employee_timeline_kind ON employee_timeline (employee, kind, at, id);
-- A chain's entries are few (hops ≤ 8, fan-out ≤ 50): found through the chain, then sorted.
-- fastupdate off: no pending list whose flush would land on one hot-path insert.
CREATE INDEX employee_timeline_chains ON employee_timeline USING gin (chains)
    WITH (fastupdate = off);
CREATE INDEX employee_timeline_age ON employee_timeline USING brin (at);

-- The chains of a turn's inputs: set when the turn loads them, completed by its consuming save.
ALTER TABLE turns ADD COLUMN chains text[];

-- The relay's Temporal breaker, as each relay last said (the request path reads it, never
-- Temporal, I2): refreshed at every failed probe while open, so a row not refreshed for a while
-- belongs to a relay that is gone.
CREATE TABLE relay_breakers (
    relay_id    text PRIMARY KEY,
    open        boolean NOT NULL,
    opened_at   timestamptz,
    probe_at    timestamptz,
    error       text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Deliveries: the router's statement adds them (accepted at the ingress row's time, routed
-- now); one set-based insert per statement, not a call per row.
CREATE FUNCTION timeline_deliveries_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, at, kind, thread, chains, ref, detail)
    SELECT split_part(d.stream_key, '/', 1), e.at, e.kind, d.thread, ARRAY[d.chain_id],
           d.id::text,
           jsonb_build_object('seq', d.seq, 'class', d.class, 'type', d.type,
                              'source', d.route ->> 'kind', 'trigger', d.route ->> 'trigger',
                              'from', d.route ->> 'from', 'ingress', d.ingress_id,
                              'lane', split_part(d.stream_key, '/', 3))
    FROM added d
    CROSS JOIN LATERAL (VALUES (d.ingress_received_at, 'input.accepted'),
                               (clock_timestamp(), 'input.routed')) AS e(at, kind);
    RETURN NULL;
END
$$;
CREATE TRIGGER bus_deliveries_timeline_added AFTER INSERT ON bus_deliveries
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION timeline_deliveries_added();

-- A delivery's status moves: delivered (the relay's commit), dead (with its reason's code),
-- skipped (`on_busy: skip`), pending again. Consumed inputs are told by their turn's entry.
CREATE FUNCTION timeline_deliveries_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, at, kind, thread, chains, ref, detail)
    SELECT split_part(n.stream_key, '/', 1), clock_timestamp(),
           CASE n.status WHEN 'delivered' THEN 'input.delivered' WHEN 'dead' THEN 'input.dead'
                         WHEN 'pending' THEN 'input.pending' ELSE 'input.skipped' END,
           n.thread, ARRAY[n.chain_id], n.id::text,
           jsonb_build_object('seq', n.seq, 'class', n.class, 'attempts', n.attempts,
                              'reason', left(split_part(n.reason, ':', 1), 80))
    FROM moved_to n JOIN moved_from o ON o.id = n.id
    WHERE o.status IS DISTINCT FROM n.status
      AND (n.status IN ('delivered', 'dead', 'pending')
           OR (n.status = 'done' AND n.reason LIKE 'skipped:%'));
    RETURN NULL;
END
$$;
CREATE TRIGGER bus_deliveries_timeline_moved AFTER UPDATE ON bus_deliveries
    REFERENCING OLD TABLE AS moved_from NEW TABLE AS moved_to
    FOR EACH STATEMENT EXECUTE FUNCTION timeline_deliveries_moved();

-- A turn ended: done (its consuming save), failed, cancelled or interrupted, with its steps
-- (completed model calls), tokens and cost from its spend events.
CREATE FUNCTION timeline_turn_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    SELECT NEW.employee, 'turn.' || NEW.status, NEW.thread, coalesce(NEW.chains, '{}'), NEW.id,
           jsonb_build_object('n', NEW.n, 'class', NEW.class, 'agent', NEW.agent,
                              'steps', s.steps, 'tokens', s.tokens, 'usd', s.usd,
                              'seconds', round(extract(epoch FROM clock_timestamp()
                                                                   - NEW.started_at), 3),
                              'error', left(split_part(NEW.error, ':', 1), 80))
    FROM (SELECT count(*) FILTER (WHERE state = 'settled'
                                    AND coalesce(input_tokens, 0) + coalesce(output_tokens, 0) > 0)
                     AS steps,
                 coalesce(sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)), 0) AS tokens,
                 coalesce(sum(actual_usd) FILTER (WHERE state = 'settled'), 0) AS usd
          FROM spend_events WHERE turn_id = NEW.id) s;
    RETURN NULL;
END
$$;
CREATE TRIGGER turns_timeline_ended AFTER UPDATE OF status ON turns
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION timeline_turn_ended();

-- An outbox row: queued (a reply, or an owner's Retry), held, sent, failed, unknown, expired.
-- Its thread and chains are its turn's.
CREATE FUNCTION timeline_outbound() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    SELECT NEW.employee, 'reply.' || NEW.status, coalesce(t.thread, NEW.thread),
           coalesce(t.chains, '{}'), NEW.id::text,
           jsonb_build_object('channel', NEW.kind, 'turn', NEW.turn_id,
                              'held_reason', NEW.held_reason, 'attempts', NEW.attempts,
                              'retry', NEW.retry_requested_at IS NOT NULL)
    FROM (SELECT 1) one LEFT JOIN turns t ON t.id = NEW.turn_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER outbound_messages_timeline_added AFTER INSERT ON outbound_messages
    FOR EACH ROW EXECUTE FUNCTION timeline_outbound();
CREATE TRIGGER outbound_messages_timeline_moved AFTER UPDATE OF status ON outbound_messages
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status <> 'sending')
    EXECUTE FUNCTION timeline_outbound();

-- Alarms (and task deadlines): set, fired (each occurrence of a repeat), missed, cancelled.
CREATE FUNCTION timeline_alarm() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    what text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        what := 'alarm.set';
    ELSIF NEW.status IN ('missed', 'cancelled') THEN
        what := 'alarm.' || NEW.status;
    ELSIF NEW.fired_at IS DISTINCT FROM OLD.fired_at THEN
        what := 'alarm.fired';
    ELSE
        what := 'alarm.missed';
    END IF;
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    VALUES (NEW.employee, what, NEW.thread, ARRAY[NEW.chain_id], NEW.id,
            jsonb_build_object('alarm_kind', NEW.kind, 'due_at', NEW.due_at,
                               'occurrence', NEW.occurrence));
    RETURN NULL;
END
$$;
CREATE TRIGGER alarms_timeline_added AFTER INSERT ON alarms
    FOR EACH ROW EXECUTE FUNCTION timeline_alarm();
CREATE TRIGGER alarms_timeline_moved AFTER UPDATE OF status, occurrence ON alarms
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       OR OLD.occurrence IS DISTINCT FROM NEW.occurrence)
    EXECUTE FUNCTION timeline_alarm();

-- Delegated tasks, on the delegator's timeline (the assignee sees the task arrive as an input).
CREATE FUNCTION timeline_task() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    VALUES (NEW.from_employee,
            CASE WHEN TG_OP = 'INSERT' THEN 'task.delegated' ELSE 'task.' || NEW.status END,
            NEW.reply_to ->> 'thread', ARRAY[NEW.chain_id], NEW.id,
            jsonb_build_object('to', NEW.to_employee, 'deadline_at', NEW.deadline_at));
    RETURN NULL;
END
$$;
CREATE TRIGGER ipc_tasks_timeline_added AFTER INSERT ON ipc_tasks
    FOR EACH ROW EXECUTE FUNCTION timeline_task();
CREATE TRIGGER ipc_tasks_timeline_moved AFTER UPDATE OF status ON ipc_tasks
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION timeline_task();

-- A tool call that finished (done, or `unknown`), with its outcome's code.
CREATE FUNCTION timeline_tool_call() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    SELECT NEW.employee, 'tool.' || NEW.status, NEW.thread, coalesce(t.chains, '{}'), NEW.id,
           jsonb_build_object('tool', NEW.name, 'effect', NEW.effect, 'outcome', NEW.outcome,
                              'turn', NEW.turn_id)
    FROM (SELECT 1) one LEFT JOIN turns t ON t.id = NEW.turn_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER tool_calls_timeline_added AFTER INSERT ON tool_calls
    FOR EACH ROW WHEN (NEW.status <> 'calling') EXECUTE FUNCTION timeline_tool_call();
CREATE TRIGGER tool_calls_timeline_moved AFTER UPDATE OF status ON tool_calls
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status <> 'calling')
    EXECUTE FUNCTION timeline_tool_call();

-- An attention item raised (its first raise; repeats count on the item). About a turn (`ref`
-- its id) or a stream (`<stream_key>#…`), it takes that thread (and the turn's chains).
CREATE FUNCTION timeline_attention() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    SELECT NEW.employee, 'attention.raised',
           coalesce(t.thread, CASE WHEN NEW.ref LIKE '%/%/%/%#%'
                                   THEN split_part(split_part(NEW.ref, '#', 1), '/', 4) END),
           coalesce(t.chains, '{}'), NEW.id::text,
           jsonb_build_object('attention', NEW.kind, 'severity', NEW.severity)
    FROM (SELECT 1) one LEFT JOIN turns t ON t.id = NEW.ref;
    RETURN NULL;
END
$$;
CREATE TRIGGER attention_items_timeline AFTER INSERT ON attention_items
    FOR EACH ROW EXECUTE FUNCTION timeline_attention();
