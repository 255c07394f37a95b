-- name: approval_insert
-- A held send's approval, made with its outbox row (a retried save finds the first one).
INSERT INTO approvals (id, employee, generation, thread, turn_id, kind, outbound_id, audience,
    expires_at)
VALUES (%(id)s, %(employee)s, %(generation)s, %(thread)s, %(turn_id)s, 'send', %(outbound_id)s,
    %(audience)s, now() + make_interval(hours => %(expire_after_h)s))
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: approval_insert_tool
-- A tool call that needs approval waits on its row (a retried activity finds the first one).
INSERT INTO approvals (id, employee, generation, thread, turn_id, kind, tool_call, draft,
    audience, expires_at)
VALUES (%(id)s, %(employee)s, %(generation)s, %(thread)s, %(turn_id)s, 'tool', %(tool_call)s,
    %(draft)s, %(audience)s, now() + make_interval(hours => %(expire_after_h)s))
ON CONFLICT (id) DO NOTHING;

-- name: outbound_hold_for_approval
-- A new reply that needs approval, or that content rules hold, waits until the decision is
-- taken; the reason names the rules (or `approval`), never what matched.
UPDATE outbound_messages
SET status = 'held', held_reason = %(reason)s, approval_id = %(approval)s, updated_at = now()
WHERE id = %(id)s AND status = 'queued';

-- name: generation_egress_policy
-- What a generation's frozen spec asks approval for, its content rules, and the spec's digest.
SELECT spec -> 'spec' -> 'approvals' AS approvals, spec -> 'spec' -> 'content_rules' AS rules,
    spec_sha256
FROM generations WHERE employee = %(employee)s AND generation = %(generation)s;

-- name: approval_read
-- An approval as its workflow sees it: the state, and the seconds to its reminder and expiry.
SELECT state, taken_at IS NOT NULL AS taken,
    extract(epoch FROM expires_at - clock_timestamp())::float8 AS expires_in_s,
    CASE WHEN reminded_at IS NULL
         THEN extract(epoch FROM expires_at - interval '24 hours' - clock_timestamp())::float8
    END AS remind_in_s
FROM approvals WHERE id = %(id)s;

-- name: approval_remind
-- The one reminder, 24 h before expiry: an attention item for whoever may decide.
WITH a AS (
    UPDATE approvals SET reminded_at = now()
    WHERE id = %(id)s AND state = 'pending' AND reminded_at IS NULL
    RETURNING id, employee, audience, expires_at
)
INSERT INTO attention_items (employee, kind, severity, ref, detail, audience)
SELECT employee, %(kind)s, 'warning', 'approval#' || id,
    'approval ' || id || ' expires at ' || to_char(expires_at AT TIME ZONE 'UTC',
                                                    'YYYY-MM-DD HH24:MI') || ' UTC', audience
FROM a
ON CONFLICT (kind, ref) WHERE state = 'open' DO NOTHING;

-- name: approval_expire
-- An undecided approval past its time: expired, with an attention item; the state it has.
WITH a AS (
    UPDATE approvals SET state = 'expired', decided_at = now(),
        decision_seq = nextval('approvals_decision_seq')
    WHERE id = %(id)s AND state = 'pending' AND expires_at <= now()
    RETURNING id, employee, audience
), item AS (
    INSERT INTO attention_items (employee, kind, severity, ref, detail, audience)
    SELECT employee, %(kind)s, 'warning', 'approval#' || id,
        'approval ' || id || ' expired undecided; its send was not made', audience
    FROM a
    ON CONFLICT (kind, ref) WHERE state = 'open' DO NOTHING
)
SELECT coalesce((SELECT 'expired' FROM a), (SELECT state FROM approvals WHERE id = %(id)s))
    AS state;

-- name: approval_decide
-- The decision, written first (an intent then nudges the workflow); NULL when the approval is
-- not pending, or not the caller's: the admin decides every one, a user only one handed to it
-- (`audience`, set for `decided_by: user` holds of its own chat since its record was made).
UPDATE approvals
SET state = %(state)s, decided_at = now(), decided_by = %(by)s,
    decision_seq = nextval('approvals_decision_seq')
WHERE id = %(id)s AND state = 'pending'
  AND (%(admin)s OR (audience = %(audience)s
                     AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)))
RETURNING id, employee, generation, state, decision_seq;

-- name: approval_get
-- One approval, for the owner API (its audience checked by the caller). `audience` is the
-- user it was handed to (`decided_by: user`), NULL for the admin's.
SELECT a.id, a.employee, a.generation, a.thread, a.turn_id, a.kind, a.outbound_id, a.audience,
    a.state, a.expires_at, a.reminded_at, a.decided_at, a.decided_by, a.taken_at,
    a.created_at, a.tool_call, o.kind AS channel, coalesce(o.body, a.draft) AS draft,
    o.status AS send_status, o.held_reason
FROM approvals a LEFT JOIN outbound_messages o ON o.id = a.outbound_id
WHERE a.id = %(id)s;

-- name: approvals_list
-- Approvals newest first, of one state; a user's: only those handed to it (since its record).
-- `held_reason` (a send's: the content rules' ids, or `approval`) names the rule that held it.
SELECT a.id, a.employee, a.thread, a.turn_id, a.kind, a.state, a.expires_at, a.decided_at,
    a.decided_by, a.taken_at, a.created_at, o.kind AS channel,
    coalesce(o.body, a.draft) AS draft, o.status AS send_status, o.held_reason
FROM approvals a LEFT JOIN outbound_messages o ON o.id = a.outbound_id
WHERE (%(state)s::text IS NULL OR a.state = %(state)s)
  AND (%(admin)s OR (a.audience = %(audience)s
                     AND (%(since)s::timestamptz IS NULL
                          OR a.created_at >= %(since)s::timestamptz)))
  AND (%(employee)s::text IS NULL OR a.employee = %(employee)s)
ORDER BY a.created_at DESC, a.id LIMIT %(limit)s;

-- name: approval_take
-- Act on a decision once: an approved send is queued for the egress, a declined or expired
-- one settled; NULL when it was taken already (by the turn or the watchdog) or is undecided.
WITH a AS (
    UPDATE approvals SET taken_at = now()
    WHERE id = %(id)s AND state <> 'pending' AND taken_at IS NULL
    RETURNING id, state, outbound_id, decided_at
), o AS (
    UPDATE outbound_messages m
    SET status = CASE a.state WHEN 'approved' THEN 'queued'
                              WHEN 'expired' THEN 'expired' ELSE 'failed' END,
        error = CASE a.state WHEN 'declined' THEN 'declined by the owner' END,
        retry_requested_at = CASE WHEN %(to_egress)s AND a.state = 'approved'
                                  THEN a.decided_at END,
        updated_at = now()
    FROM a WHERE m.id = a.outbound_id AND m.status = 'held'
    RETURNING m.id
)
SELECT a.id, a.state, a.outbound_id FROM a;

-- name: approvals_untaken
-- Decided approvals nobody acted on for a while, in decision order (the watchdog's list), with
-- whether their generation runs.
SELECT a.id, a.employee, a.state, a.outbound_id, g.state = 'running' AS running
FROM approvals a
JOIN generations g ON g.employee = a.employee AND g.generation = a.generation
WHERE a.taken_at IS NULL AND a.state <> 'pending'
  AND a.decided_at < now() - make_interval(secs => %(after_s)s)
ORDER BY a.decision_seq LIMIT %(limit)s;

-- name: approvals_ahead
-- Approved sends of the employee decided before this one and not out yet (decision order).
SELECT count(*) AS n FROM approvals a JOIN outbound_messages o ON o.id = a.outbound_id
WHERE a.employee = %(employee)s AND a.state = 'approved'
  AND a.decision_seq < (SELECT decision_seq FROM approvals WHERE outbound_id = %(outbound_id)s)
  AND o.status IN ('held', 'queued', 'sending');
