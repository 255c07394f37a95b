-- name: console_chat_employees
-- The employees whose live generation takes owner chat, by name (at most `limit`).
SELECT DISTINCT s.employee AS name
FROM bus_subscriptions s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE g.state <> 'retired' AND s.trigger_kind = 'chat'
ORDER BY s.employee
LIMIT %(limit)s;

-- name: console_employee_page
-- A page of employees by name after `after`: the live generation and the budget of today.
SELECT e.name, g.generation, g.state, g.pause_reason,
       coalesce((g.limits ->> 'daily_usd')::numeric,
                (g.spec -> 'spec' -> 'budget' ->> 'daily_usd')::numeric) AS daily_usd,
       b.state AS budget_state,
       CASE WHEN b.period_end > now() THEN coalesce(sp.spent_usd, 0) ELSE 0 END AS spent_usd,
       CASE WHEN b.period_end > now() THEN coalesce(sp.reserved_usd, 0) ELSE 0 END AS reserved_usd
FROM employees e
LEFT JOIN generations g ON g.employee = e.name AND g.state <> 'retired'
LEFT JOIN employee_budgets b ON b.employee = e.name
LEFT JOIN employee_spend sp ON sp.employee = e.name AND sp.period_start = b.period_start
WHERE e.name > %(after)s AND e.deleted_at IS NULL
ORDER BY e.name
LIMIT %(limit)s;

-- name: console_pending_by_class
-- Inputs routed to these employees' live streams and not yet consumed, by class; each
-- employee's rows are read up to `cap` (the count then says "at least").
SELECT e.name AS employee, x.class, count(*) AS n
FROM unnest(%(names)s::text[]) AS e(name)
CROSS JOIN LATERAL (
    SELECT d.class
    FROM bus_streams s
    JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
    JOIN bus_deliveries d ON d.stream_key = s.stream_key AND d.seq > s.consumed_seq
    WHERE s.employee = e.name AND g.state <> 'retired'
      AND (s.top_pending_class IS NOT NULL OR s.delivered_seq > s.consumed_seq)
      AND d.status IN ('pending', 'held', 'delivered')
    LIMIT %(cap)s
) x
GROUP BY e.name, x.class;

-- name: console_attention_open_counts
-- How many attention items are not resolved (open or acknowledged) per employee, for these
-- employees.
SELECT employee, count(*) AS n
FROM attention_items
WHERE state IN ('open', 'acked') AND employee = ANY(%(names)s::text[])
GROUP BY employee;

-- name: console_conversations
-- A page of an employee's conversations (newest generation first; agent and thread descending,
-- the primary key read backwards), each with its stream's inputs not yet consumed and the
-- reason the stream is held, if it is.
SELECT c.generation, c.agent, c.thread, s.lane, c.next_turn - 1 AS turns, c.updated_at,
       c.transcript_n AS transcript_messages,
       greatest(s.next_seq - 1 - s.consumed_seq, 0) AS unconsumed, s.hold_reason
FROM conversations c
JOIN bus_streams s ON s.stream_key = c.stream_key
WHERE c.employee = %(employee)s
  AND (%(after_generation)s::integer IS NULL
       OR (c.generation, c.agent, c.thread)
          < (%(after_generation)s::integer, %(after_agent)s::text, %(after_thread)s::text))
ORDER BY c.generation DESC, c.agent DESC, c.thread DESC
LIMIT %(limit)s;

-- name: console_turns
-- A page of an employee's turns newest first (one thread's, with `thread`), before a cursor.
SELECT id, generation, agent, thread, n, class, status, started_at, ended_at,
       left(error, 500) AS error, admission_wait_s
FROM turns
WHERE employee = %(employee)s
  AND (%(thread)s::text IS NULL OR thread = %(thread)s::text)
  AND (%(before_at)s::timestamptz IS NULL
       OR (started_at, id) < (%(before_at)s::timestamptz, %(before_id)s::text))
ORDER BY started_at DESC, id DESC
LIMIT %(limit)s;

-- name: console_turn
-- One turn of an employee, as the turns page lists it.
SELECT id, generation, agent, thread, n, class, status, started_at, ended_at,
       left(error, 500) AS error, admission_wait_s
FROM turns
WHERE employee = %(employee)s AND id = %(turn_id)s;

-- name: console_turn_llm_steps
-- The model calls of these turns (up to `cap` each), one row per call with its attempts (a
-- spend key is `{workflow}:{activity}:{attempt}`; the activity `…:step-N[-rK]`): model, tokens
-- and what they cost (a reservation still open counts its estimate), when the first attempt
-- began and the last one ended (NULL: still running), and the last attempt's state.
SELECT t.id AS turn_id, x.*
FROM unnest(%(turns)s::text[]) AS t(id)
CROSS JOIN LATERAL (
    SELECT min(e.created_at) AS at,
           CASE WHEN bool_and(e.settled_at IS NOT NULL) THEN max(e.settled_at) END AS ended_at,
           (array_agg(e.model ORDER BY e.created_at DESC))[1] AS model,
           (array_agg(e.state ORDER BY e.created_at DESC))[1] AS state,
           substring(min(e.key) FROM ':step-([0-9]+)')::integer AS step,
           count(*)::integer AS attempts,
           sum(e.input_tokens)::integer AS input_tokens,
           sum(e.output_tokens)::integer AS output_tokens,
           sum(coalesce(e.actual_usd,
                        CASE WHEN e.state = 'reserved' THEN e.estimate_usd ELSE 0 END)) AS usd
    FROM spend_events e
    WHERE e.turn_id = t.id
    GROUP BY coalesce(substring(e.key FROM '^(.*):[0-9]+$'), e.key)
    ORDER BY min(e.created_at)
    LIMIT %(cap)s
) x;

-- name: console_turn_tool_steps
-- The tool calls of these turns (up to `cap` each): name, effect and outcome, attempts, when
-- each began and finished; never the arguments or the result.
SELECT t.id AS turn_id, x.*
FROM unnest(%(turns)s::text[]) AS t(id)
CROSS JOIN LATERAL (
    SELECT created_at AS at, finished_at AS ended_at, name, effect, status, outcome, attempts
    FROM tool_calls
    WHERE turn_id = t.id
    ORDER BY created_at
    LIMIT %(cap)s
) x;

-- name: console_turn_transcript
-- The transcript messages a turn appended (its inputs as the model read them, its answers,
-- its tool calls and their results), in order, up to `cap`; each message's text is cut at
-- `chars` characters by the caller.
SELECT n, message
FROM transcript_messages
WHERE employee = %(employee)s AND generation = %(generation)s AND agent = %(agent)s
  AND thread = %(thread)s AND turn_id = %(turn_id)s
ORDER BY n
LIMIT %(cap)s;

-- name: console_transcript_viewed
-- A view of a turn's transcript, on the employee's timeline: who looked, and when.
INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
SELECT employee, 'transcript.viewed', thread, coalesce(chains, '{}'), id,
       jsonb_build_object('n', n, 'by', %(by)s::text, 'messages', %(messages)s::integer)
FROM turns WHERE id = %(turn_id)s AND employee = %(employee)s;

-- name: console_chat_history
-- A page of one audience's messages in a session, newest first, each with its reply and what
-- became of its turn's reply (its outbox row's status and approval: held, declined, expired).
SELECT m.id, m.text, m.status, m.created_at, r.text AS reply, o.send_status, o.approval_state
FROM chat_messages m
LEFT JOIN LATERAL (
    SELECT text FROM chat_events
    WHERE turn_id = m.turn_id AND kind = 'reply' AND employee = m.employee
      AND audience = m.audience AND pos IS NOT NULL  -- not placed yet: the stream brings it
    ORDER BY pos LIMIT 1
) r ON m.turn_id IS NOT NULL
LEFT JOIN LATERAL (
    SELECT x.status AS send_status, a.state AS approval_state
    FROM outbound_messages x LEFT JOIN approvals a ON a.id = x.approval_id
    WHERE x.turn_id = m.turn_id AND x.kind = 'chat' ORDER BY x.id DESC LIMIT 1
) o ON m.turn_id IS NOT NULL
WHERE m.employee = %(employee)s AND m.audience = %(audience)s AND m.session = %(session)s
  AND (%(since)s::timestamptz IS NULL OR m.created_at >= %(since)s::timestamptz)
  AND (%(before)s::bigint IS NULL OR m.id < %(before)s::bigint)
ORDER BY m.id DESC
LIMIT %(limit)s;

-- name: console_chat_last_event
-- The last place of one audience's session's chat events (where its event stream goes on
-- from; read in the history's snapshot, so a reply is either listed or streamed, never both).
SELECT coalesce(max(pos), 0) AS id FROM chat_events
WHERE employee = %(employee)s AND audience = %(audience)s AND session = %(session)s;

-- name: console_employee_exists
-- Whether an employee was applied (its spec is not read).
SELECT 1 AS found FROM employees WHERE name = %(name)s;

-- name: console_counts
-- What waits for the caller, for the console's navigation, each counted up to `cap`: attention
-- items open (not yet acknowledged), approvals pending, outbox rows `unknown` (admin only, else
-- NULL). A user's are its own audience's since its record, as the lists show them.
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM attention_items
        WHERE state = 'open'
          AND (%(admin)s OR (audience = %(audience)s
                             AND (%(since)s::timestamptz IS NULL
                                  OR first_seen >= %(since)s::timestamptz)))
        LIMIT %(cap)s) a) AS attention_open,
    (SELECT count(*) FROM (
        SELECT 1 FROM approvals
        WHERE state = 'pending' AND taken_at IS NULL
          AND (%(admin)s OR (audience = %(audience)s
                             AND (%(since)s::timestamptz IS NULL
                                  OR created_at >= %(since)s::timestamptz)))
        LIMIT %(cap)s) p) AS approvals_pending,
    CASE WHEN %(admin)s THEN (SELECT count(*) FROM (
        SELECT 1 FROM outbound_messages WHERE status = 'unknown' LIMIT %(cap)s) o)
    END AS outbox_unknown;
