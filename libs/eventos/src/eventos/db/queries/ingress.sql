-- name: webhook_endpoint
-- The endpoint a webhook path resolves to, from running, paused or starting generations.
SELECT s.employee, s.generation, s.trigger_name, s.class, s.params
FROM bus_subscriptions s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE s.source_key = %(source_key)s AND s.trigger_kind = 'webhook'
  AND g.state IN ('starting', 'running', 'paused')
ORDER BY s.generation DESC
LIMIT 1;

-- name: chat_session_lock
-- Serialize the pending check of one chat session of the admin, or of a user's every session
-- (its `lock_session` is empty).
SELECT pg_advisory_xact_lock(hashtextextended(
    'eventos.chat:' || %(employee)s || '/' || %(audience)s || '/' || %(lock_session)s, 0));

-- name: chat_pending_count
-- Queued owner messages, up to the bound: of one session for the admin, of every session of
-- the audience for a user (`per_session` false).
SELECT count(*) AS n FROM (
    SELECT 1 FROM chat_messages
    WHERE employee = %(employee)s AND audience = %(audience)s
      AND (NOT %(per_session)s OR session = %(session)s)
      AND status = 'queued'
    LIMIT %(cap)s
) t;

-- name: chat_existing
-- A message already sent with this client id (by this user record, for a user).
SELECT id, status FROM chat_messages
WHERE employee = %(employee)s AND audience = %(audience)s AND session = %(session)s
  AND client_message_id = %(client_message_id)s
  AND coalesce(user_id, '00000000-0000-0000-0000-000000000000'::uuid)
      = coalesce(%(user_id)s::uuid, '00000000-0000-0000-0000-000000000000'::uuid);

-- name: chat_insert
-- The owner's message; its ingress row is appended in the same transaction.
INSERT INTO chat_messages (employee, audience, session, client_message_id, text, ingress_id,
    user_id)
VALUES (%(employee)s, %(audience)s, %(session)s, %(client_message_id)s, %(text)s, %(ingress_id)s,
    %(user_id)s)
RETURNING id, status;

-- name: webhook_endpoints
-- Every webhook endpoint of starting, running or paused generations (the route table).
SELECT DISTINCT ON (s.source_key) s.source_key, s.employee, s.generation, s.trigger_name,
       s.class, s.params
FROM bus_subscriptions s
JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
WHERE s.trigger_kind = 'webhook' AND g.state IN ('starting', 'running', 'paused')
ORDER BY s.source_key, s.generation DESC;

-- name: webhook_unrouted_counts
-- Accepted, not yet routed rows per webhook source (for the backlog high water).
SELECT source_key, count(*) AS n FROM bus_ingress
WHERE status = 'accepted' AND source_key LIKE 'webhook:%%'
GROUP BY source_key;

-- name: chat_trigger_live
-- Whether the employee's live generation takes owner chat (it has a chat trigger).
SELECT EXISTS (
    SELECT 1 FROM bus_subscriptions s
    JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
    WHERE s.employee = %(employee)s AND g.state <> 'retired' AND s.trigger_kind = 'chat'
) AS takes;
