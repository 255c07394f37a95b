-- name: conversation_open
-- The conversation row (created on first use); its next turn number is taken.
INSERT INTO conversations (employee, generation, agent, thread, stream_key, next_turn)
VALUES (%(employee)s, %(generation)s, %(agent)s, %(thread)s, %(stream_key)s, 2)
ON CONFLICT (employee, generation, agent, thread) DO UPDATE
    SET next_turn = conversations.next_turn + 1
RETURNING next_turn - 1 AS n;

-- name: turn_insert
-- A turn admitted, with how long its entity waited for the slot.
INSERT INTO turns (id, employee, generation, agent, thread, n, class, stream_key,
    admission_wait_s, ask)
VALUES (%(id)s, %(employee)s, %(generation)s, %(agent)s, %(thread)s, %(n)s, %(class)s,
    %(stream_key)s, %(waited_s)s, %(ask)s);

-- name: turn_finish
-- A turn ended (unless the consuming save already recorded it).
UPDATE turns SET status = %(status)s, error = %(error)s, ended_at = coalesce(ended_at, now())
WHERE id = %(turn_id)s AND status = 'running';

-- name: turn_timing
-- A turn's class, status and duration (to its end, or to now while it runs), for its metric.
SELECT class, status,
       extract(epoch FROM coalesce(ended_at, clock_timestamp()) - started_at)::float8 AS duration_s
FROM turns WHERE id = %(turn_id)s;

-- name: conversation_load
-- The transcript's version and the generation's frozen spec.
SELECT c.transcript_n, c.transcript_total, g.spec
FROM generations g
LEFT JOIN conversations c ON c.employee = g.employee AND c.generation = g.generation
    AND c.agent = %(agent)s AND c.thread = %(thread)s
WHERE g.employee = %(employee)s AND g.generation = %(generation)s;

-- name: turn_lock
-- The saving turn must still be the running one (a cancelled turn never saves late).
SELECT status FROM turns WHERE id = %(turn_id)s FOR UPDATE;

-- name: stream_consume
-- `consumed_seq` is the watermark below which every input is settled (a higher class may be
-- consumed before a lower one); run after settling the deliveries. Only seqs this snapshot
-- sees count, so a delivery the router adds meanwhile is never skipped. A window hold lifts.
UPDATE bus_streams s
SET consumed_seq = greatest(s.consumed_seq, coalesce(
        (SELECT min(d.seq) - 1 FROM bus_deliveries d
         WHERE d.stream_key = s.stream_key AND d.seq > s.consumed_seq
           AND d.status IN ('pending', 'held', 'delivered')),
        (SELECT max(d.seq) FROM bus_deliveries d
         WHERE d.stream_key = s.stream_key AND d.seq > s.consumed_seq),
        s.consumed_seq)),
    hold_reason = CASE WHEN s.hold_reason = 'window' THEN NULL ELSE s.hold_reason END,
    updated_at = now()
WHERE s.stream_key = %(stream_key)s;

-- name: deliveries_consume
-- The consumed deliveries are done (`pending` too: Temporal may have accepted a batch whose
-- delivered_seq commit has not happened yet; `dead(reset)` too: a Reset settles a turn's inputs
-- at once, and the turn it cancelled may still save while it drains — then they were consumed).
UPDATE bus_deliveries
SET status = 'done', reason = CASE WHEN status = 'dead' THEN NULL ELSE reason END,
    updated_at = now()
WHERE stream_key = %(stream_key)s AND seq = ANY(%(seqs)s)
  AND (status IN ('pending', 'delivered') OR (status = 'dead' AND reason = 'reset'));

-- name: chat_messages_answered
-- Owner messages the turn consumed (`dead` too: a Reset's, when the turn it cancelled still
-- saved while it drained — see deliveries_consume).
UPDATE chat_messages SET status = 'answered', turn_id = %(turn_id)s
WHERE ingress_id = ANY(%(ingress_ids)s) AND status IN ('queued', 'delivered', 'dead');

-- name: chat_messages_taken
-- Owner messages a run took (at its start or a merge); their ids for the event stream.
UPDATE chat_messages SET status = 'delivered', turn_id = %(turn_id)s
WHERE ingress_id = ANY(%(ingress_ids)s) AND status IN ('queued', 'delivered')
RETURNING id;

-- name: chat_event_insert
-- A run event for the session's audience, once per dedupe key.
INSERT INTO chat_events (employee, audience, session, kind, turn_id, dedupe_key, message_ids)
VALUES (%(employee)s, %(audience)s, %(session)s, %(kind)s, %(turn_id)s, %(dedupe_key)s,
    %(message_ids)s)
ON CONFLICT (dedupe_key) DO NOTHING;

-- name: turn_done
-- Record the consuming save on the turn, with the chains of every input it consumed (those it
-- loaded first, then the merged ones, each once) for its timeline entry.
UPDATE turns SET status = 'done', consumed_seq = %(through)s, ended_at = now(),
    chains = ARRAY(
        SELECT u.c FROM unnest(coalesce(chains, '{}') || ARRAY(
            SELECT d.chain_id FROM bus_deliveries d
            WHERE d.stream_key = %(stream_key)s AND d.seq = ANY(%(seqs)s) ORDER BY d.seq
        )) WITH ORDINALITY AS u(c, k)
        GROUP BY u.c ORDER BY min(u.k))
WHERE id = %(turn_id)s;

-- name: outbound_insert
-- The reply enters the outbox once (the idempotency key makes a retried save a no-op).
INSERT INTO outbound_messages (idempotency_key, employee, thread, turn_id, account, recipient,
    recipient_key_id, kind, class, body, audience)
VALUES (%(key)s, %(employee)s, %(thread)s, %(turn_id)s, %(account)s, %(recipient)s,
    %(recipient_key_id)s, %(kind)s, %(class)s, %(body)s, %(audience)s)
ON CONFLICT (idempotency_key) DO UPDATE SET updated_at = outbound_messages.updated_at
RETURNING id;

-- name: outbound_claim
-- Claim a queued send by compare-and-swap.
UPDATE outbound_messages
SET status = 'sending', claim_token = %(token)s, claimed_at = now(), provider_called_at = NULL,
    attempts = attempts + 1, updated_at = now()
WHERE id = %(id)s AND status = 'queued'
RETURNING id, idempotency_key, employee, thread, turn_id, kind, account, class, recipient,
    recipient_key_id, body, status, claim_token, provider_called_at, approval_id, attempts,
    extract(epoch FROM clock_timestamp() - created_at)::float8 AS age_s;

-- name: outbound_get
-- One outbox row; a claim's age says whether its attempt is over.
SELECT id, idempotency_key, employee, thread, turn_id, kind, account, class, recipient,
    recipient_key_id, body, status, claim_token, provider_called_at, approval_id, attempts,
    extract(epoch FROM clock_timestamp() - created_at)::float8 AS age_s,
    extract(epoch FROM clock_timestamp() - claimed_at)::float8 AS claim_age_s
FROM outbound_messages WHERE id = %(id)s;

-- name: chat_reply_insert
-- The owner sees the reply (once per outbox row), in the audience of its outbox row.
INSERT INTO chat_events (employee, audience, session, kind, turn_id, dedupe_key, outbound_id,
    text)
SELECT %(employee)s, coalesce(o.audience, 'owner'), %(session)s, 'reply', %(turn_id)s,
    'reply:' || %(outbound_id)s, %(outbound_id)s, %(text)s
FROM outbound_messages o WHERE o.id = %(outbound_id)s
ON CONFLICT (dedupe_key) DO NOTHING;

-- name: outbound_sent
-- The send is done.
UPDATE outbound_messages SET status = 'sent', updated_at = now()
WHERE id = %(id)s AND status = 'sending';

-- name: chat_message_get
-- One owner message of an audience with its reply, if any, what became of its turn's reply
-- (its outbox row's status and approval: whether it is held for review, declined, expired)
-- and its delivery (dead: why); never the held draft: that is the decider's to read.
SELECT m.id, m.status, m.text, m.turn_id, m.ingress_id, r.text AS reply, r.id AS reply_id,
    o.status AS send_status, o.approval_id,
    o.held_reason, a.state AS approval_state, a.expires_at AS approval_expires_at,
    t.n AS turn_n, d.status AS delivery_status, d.reason AS delivery_reason
FROM chat_messages m
LEFT JOIN chat_events r ON r.turn_id = m.turn_id AND r.kind = 'reply'
LEFT JOIN turns t ON t.id = m.turn_id
LEFT JOIN LATERAL (
    SELECT status, approval_id, held_reason FROM outbound_messages o
    WHERE o.turn_id = m.turn_id AND o.kind = 'chat' ORDER BY o.id DESC LIMIT 1
) o ON true
LEFT JOIN approvals a ON a.id = o.approval_id
LEFT JOIN LATERAL (
    SELECT status, reason FROM bus_deliveries x WHERE x.ingress_id = m.ingress_id
    ORDER BY x.id LIMIT 1
) d ON true
WHERE m.employee = %(employee)s AND m.audience = %(audience)s AND m.id = %(id)s
  AND m.created_at >= %(since)s;

-- name: chat_held_notice_insert
-- The chat is told its reply is held for review (once per held reply), in its audience.
INSERT INTO chat_events (employee, audience, session, kind, turn_id, dedupe_key, text)
VALUES (%(employee)s, %(audience)s, %(session)s, 'notice', %(turn_id)s, %(dedupe_key)s,
    %(text)s)
ON CONFLICT (dedupe_key) DO NOTHING;

-- name: chat_events_after
-- Run events and replies of one session of one audience placed after `after` (the event
-- stream's poll; by place, not id: see migration 0024).
SELECT id, pos, kind, turn_id, message_ids, text, created_at FROM chat_events
WHERE employee = %(employee)s AND audience = %(audience)s AND session = %(session)s
  AND pos > %(after)s AND created_at >= %(since)s
ORDER BY pos LIMIT 100;

-- name: outbound_fail
-- A send that can never be made (its recipient does not open): nothing was called.
UPDATE outbound_messages SET status = 'failed', claim_token = NULL, provider_called_at = NULL,
    error = 'recipient unreadable', updated_at = now()
WHERE id = %(id)s AND status IN ('queued', 'sending');

-- name: outbound_unclaim
-- Give a claim back: no provider was called, or it refused before sending (a rate limit).
UPDATE outbound_messages
SET status = 'queued', claim_token = NULL, claimed_at = NULL, provider_called_at = NULL,
    updated_at = now()
WHERE id = %(id)s AND status = 'sending' AND claim_token = %(token)s;

-- name: deliveries_dead_letter
-- A turn's inputs that failed twice are dead-lettered with a reason and the turn's id.
UPDATE bus_deliveries SET status = 'dead', reason = %(reason)s, turn_id = %(turn_id)s,
    updated_at = now()
WHERE stream_key = %(stream_key)s AND seq = ANY(%(seqs)s) AND status IN ('pending', 'delivered');

-- name: deliveries_skip
-- Ticks settled without a turn (on_busy: skip), with the reason.
UPDATE bus_deliveries SET status = 'done', reason = %(reason)s, updated_at = now()
WHERE stream_key = %(stream_key)s AND seq = ANY(%(seqs)s) AND status IN ('pending', 'delivered');

-- name: chat_messages_dead
-- Owner messages among them are marked dead too.
UPDATE chat_messages SET status = 'dead'
WHERE ingress_id = ANY(%(ingress_ids)s) AND status IN ('queued', 'delivered');

-- name: attention_raise
-- Raise an attention item, or count a repeat on the open one. An item about a turn (`ref` its
-- id) or a stream (`ref` `<stream_key>#…`) on a user's chat thread is that user's too
-- (`audience`); any other is the admin's alone (NULL).
INSERT INTO attention_items (employee, kind, severity, ref, detail, audience)
VALUES (%(employee)s, %(kind)s, %(severity)s, %(ref)s, %(detail)s, (
    SELECT u.name FROM users u WHERE u.thread IN (
        SELECT t.thread FROM turns t WHERE t.id = %(ref)s
        UNION ALL
        SELECT s.thread FROM bus_streams s WHERE s.stream_key = split_part(%(ref)s, '#', 1))
    LIMIT 1))
ON CONFLICT (kind, ref) WHERE state = 'open' DO UPDATE
    SET count = attention_items.count + 1, last_seen = now(), detail = EXCLUDED.detail;

-- name: deliveries_delivered_between
-- Inputs the entity had and did not consume yet, read back after continue-as-new. `pending`
-- too: Temporal may have accepted a batch whose delivered_seq commit has not happened yet.
SELECT seq, ingress_id, class, type, route, chain_id, hop, causation_id, size, payload, body_ref
FROM bus_deliveries
WHERE stream_key = %(stream_key)s AND seq > %(after)s AND seq <= %(through)s
  AND status IN ('pending', 'delivered')
ORDER BY seq;
