-- Failures say why (issue 26): a failed turn's timeline entry carries its whole cause as the
-- turn recorded it (eventos.failures: `<category>: <Type>: <message>`, redacted, bounded to
-- 500 characters), not only the text before its first colon.
CREATE OR REPLACE FUNCTION timeline_turn_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    SELECT NEW.employee, 'turn.' || NEW.status, NEW.thread, coalesce(NEW.chains, '{}'), NEW.id,
           jsonb_build_object('n', NEW.n, 'class', NEW.class, 'agent', NEW.agent,
                              'steps', s.steps, 'tokens', s.tokens, 'usd', s.usd,
                              'seconds', round(extract(epoch FROM clock_timestamp()
                                                                   - NEW.started_at), 3),
                              'error', left(NEW.error, 500))
    FROM (SELECT count(*) FILTER (WHERE state = 'settled'
                                    AND coalesce(input_tokens, 0) + coalesce(output_tokens, 0) > 0)
                     AS steps,
                 coalesce(sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)), 0) AS tokens,
                 coalesce(sum(actual_usd) FILTER (WHERE state = 'settled'), 0) AS usd
          FROM spend_events WHERE turn_id = NEW.id) s;
    RETURN NULL;
END
$$;
