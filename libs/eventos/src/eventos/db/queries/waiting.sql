-- name: waiting_employee
-- What holds every input of an employee alike: its live generation, its budget (the live
-- limit, as budget_source reads it, and the period's spend) and the relays' Temporal breakers:
-- open, refreshed within `fresh_s`, and no relay reached Temporal since it opened (a breaker
-- closed later); the soonest next probe.
SELECT e.name, g.generation, g.state, g.pause_reason, b.state AS budget_state, b.period_end,
       coalesce((g.limits ->> 'daily_usd')::numeric,
                (g.spec -> 'spec' -> 'budget' ->> 'daily_usd')::numeric) AS daily_usd,
       coalesce(sp.spent_usd, 0) + coalesce(sp.reserved_usd, 0) AS used_usd,
       r.breaker_probe_at, r.breaker_opened_at, r.breaker_error, now() AS now
FROM employees e
LEFT JOIN generations g ON g.employee = e.name AND g.state <> 'retired'
LEFT JOIN employee_budgets b ON b.employee = e.name
LEFT JOIN employee_spend sp ON sp.employee = e.name AND sp.period_start = b.period_start
CROSS JOIN (
    SELECT min(probe_at) AS breaker_probe_at, min(opened_at) AS breaker_opened_at,
           min(error) AS breaker_error
    FROM relay_breakers o
    WHERE o.open AND o.updated_at > now() - make_interval(secs => %(fresh_s)s)
      AND NOT EXISTS (SELECT 1 FROM relay_breakers c
                      WHERE NOT c.open AND c.updated_at > o.opened_at)
) r
WHERE e.name = %(employee)s;

-- name: waiting_inputs
-- The generation's inputs not yet consumed (routed, not settled; of one stream when `stream`
-- is given), oldest first, with their stream as a whole row (`stream`: a hold another part
-- adds, and its end, are read by name) and the stream's window use (inputs delivered and not
-- consumed, and their bytes).
SELECT d.id, d.seq, d.ingress_id, d.class, d.type, d.route, d.chain_id, d.hop, d.size,
       d.status, d.created_at, s.stream_key, s.lane, s.thread, s.hold_reason,
       to_jsonb(s) AS stream, w.inputs AS window_inputs, w.bytes AS window_bytes
FROM bus_streams s
CROSS JOIN LATERAL (
    SELECT count(*) AS inputs, coalesce(sum(size), 0) AS bytes
    FROM bus_deliveries x WHERE x.stream_key = s.stream_key AND x.status = 'delivered'
) w
CROSS JOIN LATERAL (
    SELECT * FROM bus_deliveries x
    WHERE x.stream_key = s.stream_key AND x.seq > s.consumed_seq
      AND x.status IN ('pending', 'held', 'delivered')
    ORDER BY x.seq LIMIT %(limit)s
) d
WHERE s.employee = %(employee)s AND s.generation = %(generation)s
  AND s.consumed_seq < s.next_seq - 1
  AND (%(stream)s::text IS NULL OR s.stream_key = %(stream)s)
ORDER BY d.created_at, d.id
LIMIT %(limit)s;

-- name: waiting_count
-- How many of the generation's inputs are routed and not consumed.
SELECT count(*) AS n FROM bus_deliveries d
WHERE d.subscription_id IN (SELECT id FROM bus_subscriptions
                            WHERE employee = %(employee)s AND generation = %(generation)s)
  AND d.status IN ('pending', 'held', 'delivered');

-- name: waiting_turns
-- The running turns of some streams, with their admission lease (suspended: parked, held by
-- the budget, or waiting for an approval), and when the last turn of each (stream, agent)
-- ended. A turn whose lease waits for an approval (`approval_held`) comes with its newest
-- approval: its id, kind, state, expiry and what asked for it (the outbox row's rule ids and
-- channel, or the tool's name: a tool approval's draft starts with it); never the draft.
-- (A thread name is not a stream's: `main` is the owner's talk lane and the worker lane's.)
SELECT t.stream_key, t.id, t.n, t.agent, t.status, t.started_at, t.ended_at, t.chains,
       l.state AS lease, l.suspended_reason, l.suspended_at, a.approval_id, a.approval_kind,
       a.approval_state, a.approval_expires_at, a.approval_reason, a.approval_channel,
       a.approval_tool
FROM unnest(%(streams)s::text[], %(agents)s::text[], %(threads)s::text[]) AS k(stream, agent, thread)
CROSS JOIN LATERAL (
    SELECT * FROM turns t
    WHERE t.employee = %(employee)s AND t.generation = %(generation)s AND t.agent = k.agent
      AND t.thread = k.thread AND t.stream_key = k.stream
    ORDER BY t.n DESC LIMIT 2
) t
LEFT JOIN sched_leases l ON l.turn_id = t.id
LEFT JOIN LATERAL (
    SELECT a.id AS approval_id, a.kind AS approval_kind, a.state AS approval_state,
           a.expires_at AS approval_expires_at, o.held_reason AS approval_reason,
           o.kind AS approval_channel,
           CASE WHEN a.kind = 'tool' THEN split_part(a.draft, ' ', 1) END AS approval_tool
    FROM approvals a LEFT JOIN outbound_messages o ON o.id = a.outbound_id
    WHERE a.turn_id = t.id
    ORDER BY a.created_at DESC LIMIT 1
) a ON l.state = 'suspended' AND l.suspended_reason = %(approval_held)s;

-- name: waiting_unrouted
-- Accepted ingress rows of the generation's sources the router has not routed yet, oldest
-- first, and how many in all.
SELECT i.id, i.source_key, i.type, i.received_at, count(*) OVER () AS total
FROM bus_ingress i
WHERE i.status = 'accepted'
  AND i.source_key IN (SELECT source_key FROM bus_subscriptions
                       WHERE employee = %(employee)s AND generation = %(generation)s)
ORDER BY i.id
LIMIT %(limit)s;

-- name: waiting_digests
-- Messages to the employee collected into a digest instead of delivered (their edge's bucket
-- ran dry, or its breaker is open), by sender and the thread the digest goes to.
SELECT d.sender, d.thread, e.breaker, d.count, d.due_at, e.opened_at, e.probe_at
FROM storm_digests d JOIN storm_edges e ON e.sender = d.sender AND e.target = d.target
WHERE d.target = %(employee)s AND d.count > 0
ORDER BY d.due_at
LIMIT %(limit)s;

-- name: waiting_slots_held
-- The turns holding a slot now, by class, oldest grant first (what a queued input waits for).
SELECT class, turn_id FROM sched_leases WHERE state = 'active' ORDER BY granted_at LIMIT 500;

-- name: waiting_input_of
-- One input by its ingress row (an owner message's): whether the router took it, and its
-- delivery (one: owner chat has one consumer).
SELECT i.status AS ingress_status, d.id AS delivery_id, d.stream_key, d.status
FROM bus_ingress i
LEFT JOIN LATERAL (
    SELECT * FROM bus_deliveries x WHERE x.ingress_id = i.id ORDER BY x.id LIMIT 1
) d ON true
WHERE i.id = %(ingress_id)s;
