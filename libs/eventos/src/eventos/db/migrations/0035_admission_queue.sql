-- Admission's cost does not grow with the waiting conversations (issue 27 point 1): each
-- (class, employee) row of `sched_rounds` also keeps the head of that employee's queue in the
-- class (its oldest waiter not offered a slot), kept by a trigger on `sched_waiters`, so a
-- pass reads the next employees in turn from one index (served longest ago first, never
-- served first) instead of every waiter. An employee that waits but was never served has a
-- row with `served_at` NULL.
ALTER TABLE sched_rounds ALTER COLUMN served_at DROP NOT NULL;
ALTER TABLE sched_rounds ADD COLUMN head_at timestamptz, ADD COLUMN head_key text;
CREATE INDEX sched_rounds_turns ON sched_rounds (class, served_at NULLS FIRST, head_at, head_key)
    WHERE head_at IS NOT NULL;

-- An employee's waiters in a class, oldest first (the heads, and a pass's picks); offered
-- slots (the load, lapsing offers); silent waiters; the console's list, oldest first.
CREATE INDEX sched_waiters_queue ON sched_waiters (class, employee, requested_at, stream_key)
    WHERE offered_at IS NULL;
CREATE INDEX sched_waiters_offered ON sched_waiters (offered_at) WHERE offered_at IS NOT NULL;
CREATE INDEX sched_waiters_asked ON sched_waiters (asked_at);
CREATE INDEX sched_waiters_requested ON sched_waiters (requested_at);

-- The turns admitted in the share window, by class (floors), without reading every turn.
CREATE INDEX turns_started ON turns (started_at, class);

CREATE FUNCTION sched_head_refresh(k smallint, e text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO sched_rounds AS r (class, employee, head_at, head_key)
    SELECT k, e, h.requested_at, h.stream_key
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (
        SELECT w.requested_at, w.stream_key FROM sched_waiters w
        WHERE w.class = k AND w.employee = e AND w.offered_at IS NULL
        ORDER BY w.requested_at, w.stream_key
        LIMIT 1
    ) h ON true
    ON CONFLICT (class, employee) DO UPDATE
        SET head_at = EXCLUDED.head_at, head_key = EXCLUDED.head_key
        WHERE (r.head_at, r.head_key) IS DISTINCT FROM (EXCLUDED.head_at, EXCLUDED.head_key);
$$;

CREATE FUNCTION sched_waiters_head() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM sched_head_refresh(OLD.class, OLD.employee);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE'
            AND (NEW.class, NEW.employee) IS DISTINCT FROM (OLD.class, OLD.employee)) THEN
        PERFORM sched_head_refresh(NEW.class, NEW.employee);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER sched_waiters_head_in_out AFTER INSERT OR DELETE ON sched_waiters
    FOR EACH ROW EXECUTE FUNCTION sched_waiters_head();
-- An ask again only touches `asked_at` (and rewrites the other columns to their values).
CREATE TRIGGER sched_waiters_head_moved AFTER UPDATE ON sched_waiters
    FOR EACH ROW
    WHEN ((OLD.class, OLD.employee, OLD.requested_at, OLD.offered_at)
          IS DISTINCT FROM (NEW.class, NEW.employee, NEW.requested_at, NEW.offered_at))
    EXECUTE FUNCTION sched_waiters_head();

SELECT sched_head_refresh(class, employee)
FROM (SELECT DISTINCT class, employee FROM sched_waiters) waiting;
