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

-- name: console_turn_llm_steps
-- The model calls of these turns (up to `cap` each): model, tokens and what they cost (a
-- reservation still open counts its estimate).
SELECT t.id AS turn_id, x.*
FROM unnest(%(turns)s::text[]) AS t(id)
CROSS JOIN LATERAL (
    SELECT created_at AS at, model, state, input_tokens, output_tokens,
           coalesce(actual_usd, CASE WHEN state = 'reserved' THEN estimate_usd ELSE 0 END)
               AS usd
    FROM spend_events
    WHERE turn_id = t.id
    ORDER BY created_at
    LIMIT %(cap)s
) x;

-- name: console_turn_tool_steps
-- The tool calls of these turns (up to `cap` each): name, effect and outcome, never the
-- arguments or the result.
SELECT t.id AS turn_id, x.*
FROM unnest(%(turns)s::text[]) AS t(id)
CROSS JOIN LATERAL (
    SELECT created_at AS at, name, effect, status, outcome
    FROM tool_calls
    WHERE turn_id = t.id
    ORDER BY created_at
    LIMIT %(cap)s
) x;

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
