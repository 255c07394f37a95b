-- A committed chat event wakes its employee's event streams at once (LISTEN/NOTIFY, SPEC §4;
-- issue 12 point 6): the payload is the employee, a hint only (the streams read their rows).
-- NOTIFY is delivered at commit, and one transaction's identical payloads collapse into one.
CREATE FUNCTION chat_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('eventos_chat_events', NEW.employee);
    RETURN NULL;
END
$$;
CREATE TRIGGER chat_events_notify AFTER INSERT ON chat_events
    FOR EACH ROW EXECUTE FUNCTION chat_events_notify();
