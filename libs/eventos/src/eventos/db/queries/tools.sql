-- name: tool_call_begin
-- Record an attempt of a tool call: a new row (`fresh`) or the attempts of an earlier one, with
-- what it left (a `calling` row of an unsafe call means it may have reached the outside world).
INSERT INTO tool_calls AS c (id, employee, generation, lane, thread, route, turn_id, name, effect,
    arguments, status, retry_of)
VALUES (%(id)s, %(employee)s, %(generation)s, %(lane)s, %(thread)s, %(route)s, %(turn_id)s,
    %(name)s, %(effect)s, %(arguments)s, 'calling', %(retry_of)s)
ON CONFLICT (id) DO UPDATE SET attempts = c.attempts + 1
RETURNING (xmax = 0) AS fresh, status, outcome, result, attempts, called_at, effect;

-- name: tool_call_calling
-- Just before the call may reach the outside world (committed before the call is made).
UPDATE tool_calls SET called_at = now() WHERE id = %(id)s;

-- name: tool_call_finish
-- The call's result, what the model reads back.
UPDATE tool_calls SET status = %(status)s, outcome = %(outcome)s, result = %(result)s,
    finished_at = now()
WHERE id = %(id)s;

-- name: tool_call_get
-- One call by id.
SELECT id, employee, generation, lane, thread, route, turn_id, name, effect, arguments, status,
       outcome, result, attempts, created_at, called_at, finished_at, retry_of
FROM tool_calls WHERE id = %(id)s;

-- name: attention_item_lock
-- An attention item, locked while it is acknowledged, resolved or its action taken.
SELECT id, employee, kind, severity, ref, detail, first_seen, last_seen, count, state, action,
       audience, acked_at, acked_by, resolved_at, resolved_by
FROM attention_items WHERE id = %(id)s FOR UPDATE;

-- name: attention_raise_action
-- Raise an attention item that offers an action (`retry`), or count a repeat on the open one;
-- one about a call on a user's chat thread is that user's too (`audience`).
INSERT INTO attention_items (employee, kind, severity, ref, detail, action, audience)
VALUES (%(employee)s, %(kind)s, %(severity)s, %(ref)s, %(detail)s, %(action)s,
    (SELECT u.name FROM users u WHERE u.thread = %(thread)s LIMIT 1))
ON CONFLICT (kind, ref) WHERE state = 'open' DO UPDATE
    SET count = attention_items.count + 1, last_seen = now(), detail = EXCLUDED.detail;

-- name: tool_generation_spec
-- The frozen spec of the generation a call runs in.
SELECT spec FROM generations WHERE employee = %(employee)s AND generation = %(generation)s;
