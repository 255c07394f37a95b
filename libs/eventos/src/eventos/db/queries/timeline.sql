-- name: timeline_horizon
-- The instant before which the employee's timeline can no longer change: no entry still
-- uncommitted, and none still to come, has an earlier `at`. The statement's start (later
-- entries are written after it), the start of every transaction of this database holding an
-- xid (an entry written by it carries a later clock), and the oldest unrouted ingress row of
-- the employee's sources (its `accepted` entry will carry its received_at). Read in its own
-- statement, before the page's: the page's snapshot then sees every transaction that ended
-- before this one looked.
SELECT least(
    statement_timestamp(),
    (SELECT min(a.xact_start) FROM pg_stat_activity a
     WHERE a.datname = current_database() AND a.backend_xid IS NOT NULL
       AND a.pid <> pg_backend_pid()),
    (SELECT min(i.received_at) FROM bus_ingress i
     WHERE i.status = 'accepted'
       AND i.source_key IN (SELECT s.source_key FROM bus_subscriptions s
                            WHERE s.employee = %(employee)s))
) AS horizon;

-- name: timeline_newest
-- A page of an employee's timeline, newest first, before the cursor (`before_at`, `before_id`;
-- NULL: from the top) and within [since, until); optional thread and chain. Planned with the
-- values (never as a generic plan), so a NULL filter drops out and the index that fits the
-- filters drives the page: (employee, at, id), (employee, thread, at, id), or the chain's few
-- rows through the GIN index.
SELECT id, at, kind, thread, chains, ref, detail FROM employee_timeline t
WHERE t.employee = %(employee)s AND t.at >= %(since)s AND t.at < %(until)s
  AND (%(before_at)s::timestamptz IS NULL
       OR (t.at, t.id) < (%(before_at)s::timestamptz, %(before_id)s::bigint))
  AND (%(thread)s::text IS NULL OR t.thread = %(thread)s::text)
  AND (%(chain)s::text IS NULL OR t.chains @> ARRAY[%(chain)s::text])
ORDER BY t.at DESC, t.id DESC
LIMIT %(limit)s;

-- name: timeline_oldest
-- A page oldest first, after the cursor (`after_at`, `after_id`); as timeline_newest.
SELECT id, at, kind, thread, chains, ref, detail FROM employee_timeline t
WHERE t.employee = %(employee)s AND t.at >= %(since)s AND t.at < %(until)s
  AND (%(after_at)s::timestamptz IS NULL
       OR (t.at, t.id) > (%(after_at)s::timestamptz, %(after_id)s::bigint))
  AND (%(thread)s::text IS NULL OR t.thread = %(thread)s::text)
  AND (%(chain)s::text IS NULL OR t.chains @> ARRAY[%(chain)s::text])
ORDER BY t.at, t.id
LIMIT %(limit)s;

-- name: timeline_newest_of_kinds
-- timeline_newest for some kinds: each kind's page from (employee, kind, at, id), then the
-- newest of those few (kinds × limit rows at most, never the whole timeline).
SELECT p.* FROM unnest(%(kinds)s::text[]) AS k(kind)
CROSS JOIN LATERAL (
    SELECT id, at, kind, thread, chains, ref, detail FROM employee_timeline t
    WHERE t.employee = %(employee)s AND t.kind = k.kind
      AND t.at >= %(since)s AND t.at < %(until)s
      AND (%(before_at)s::timestamptz IS NULL
           OR (t.at, t.id) < (%(before_at)s::timestamptz, %(before_id)s::bigint))
      AND (%(thread)s::text IS NULL OR t.thread = %(thread)s::text)
      AND (%(chain)s::text IS NULL OR t.chains @> ARRAY[%(chain)s::text])
    ORDER BY t.at DESC, t.id DESC
    LIMIT %(limit)s
) p
ORDER BY p.at DESC, p.id DESC
LIMIT %(limit)s;

-- name: timeline_oldest_of_kinds
-- timeline_oldest for some kinds (as timeline_newest_of_kinds).
SELECT p.* FROM unnest(%(kinds)s::text[]) AS k(kind)
CROSS JOIN LATERAL (
    SELECT id, at, kind, thread, chains, ref, detail FROM employee_timeline t
    WHERE t.employee = %(employee)s AND t.kind = k.kind
      AND t.at >= %(since)s AND t.at < %(until)s
      AND (%(after_at)s::timestamptz IS NULL
           OR (t.at, t.id) > (%(after_at)s::timestamptz, %(after_id)s::bigint))
      AND (%(thread)s::text IS NULL OR t.thread = %(thread)s::text)
      AND (%(chain)s::text IS NULL OR t.chains @> ARRAY[%(chain)s::text])
    ORDER BY t.at, t.id
    LIMIT %(limit)s
) p
ORDER BY p.at, p.id
LIMIT %(limit)s;

-- name: timeline_tool_failed
-- A tool call failed for good (its activity raised past its retries): its entry, on its turn's
-- thread and chains, with the cause (eventos.failures; no content); once per call.
INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
SELECT t.employee, 'tool.failed', t.thread, coalesce(t.chains, '{}'), %(ref)s,
       jsonb_build_object('tool', %(tool)s::text, 'outcome', 'failed', 'turn', t.id,
                          'error', %(error)s::text)
FROM turns t
WHERE t.id = %(turn_id)s
  AND NOT EXISTS (SELECT 1 FROM employee_timeline e
                  WHERE e.employee = t.employee AND e.kind = 'tool.failed' AND e.ref = %(ref)s);

-- name: timeline_turn_parked
-- A turn parked (SPEC §9): its step failed for a reason that may clear; `error` is the step's
-- cause (eventos.failures: category, type, bounded message; no content).
INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
SELECT employee, 'turn.parked', thread, coalesce(chains, '{}'), id,
       jsonb_build_object('n', n, 'class', class, 'agent', agent,
                          'error', nullif(%(error)s::text, ''))
FROM turns WHERE id = %(turn_id)s;

-- name: timeline_turn_started
-- A turn loaded its inputs: their chains go on the turn (once: a retried load writes nothing)
-- and its `started` entry is written, with how long it waited for its slot.
WITH marked AS (
    UPDATE turns SET chains = %(chains)s
    WHERE id = %(turn_id)s AND chains IS NULL
    RETURNING id, employee, thread, n, class, agent, admission_wait_s
)
INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
SELECT employee, 'turn.started', thread, %(chains)s, id,
       jsonb_build_object('n', n, 'class', class, 'agent', agent, 'inputs', %(inputs)s,
                          'waited_s', round(admission_wait_s::numeric, 3))
FROM marked;

-- name: timeline_expire
-- Entries past the retention (SPEC §15: 30 days), a batch at a time (found through the BRIN
-- index on `at`), and relay breaker rows no relay refreshed for a day.
WITH gone AS (
    DELETE FROM employee_timeline WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM employee_timeline
        WHERE at < now() - make_interval(days => %(days)s)
        LIMIT %(limit)s))
    RETURNING 1
), breakers AS (
    DELETE FROM relay_breakers WHERE updated_at < now() - interval '1 day'
)
SELECT count(*) AS n FROM gone;

-- name: relay_breaker_save
-- A relay's Temporal breaker opened (or stays open after a failed probe: `probe_s` to the next
-- one) or closed; `opened_at` keeps the first opening while it stays open.
INSERT INTO relay_breakers AS b (relay_id, open, opened_at, probe_at, error, updated_at)
VALUES (%(relay_id)s, %(open)s, CASE WHEN %(open)s THEN now() END,
    CASE WHEN %(open)s THEN now() + make_interval(secs => %(probe_s)s) END, %(error)s, now())
ON CONFLICT (relay_id) DO UPDATE
    SET open = EXCLUDED.open, probe_at = EXCLUDED.probe_at, error = EXCLUDED.error,
        opened_at = CASE WHEN NOT EXCLUDED.open THEN NULL
                         WHEN b.open THEN b.opened_at ELSE now() END,
        updated_at = now();

-- name: timeline_bulk_load
-- Bench and tests: `rows` entries for one employee spread evenly over the last `spread_s`
-- seconds, in the mix real traffic writes (per input: accepted, routed, delivered; per turn:
-- started, done; its reply queued and sent), over `threads` threads (one in five on `main`),
-- each input its own chain.
INSERT INTO employee_timeline (employee, at, kind, thread, chains, ref, detail)
SELECT %(employee)s,
       now() - make_interval(secs => (%(rows)s - g)::float8 * %(spread_s)s / %(rows)s),
       (ARRAY['input.accepted', 'input.routed', 'input.delivered', 'turn.started', 'turn.done',
              'reply.queued', 'reply.sent'])[1 + g %% 7],
       CASE WHEN (g / 7) %% 5 = 0 THEN 'main'
            ELSE 't_' || left(md5(((g / 7) %% %(threads)s)::text), 16) END,
       ARRAY['bulk-' || %(employee)s || '-' || (g / 7)::text], (g / 7)::text,
       CASE (g %% 7)
           WHEN 0 THEN jsonb_build_object('seq', g / 7, 'class', 3, 'source', 'webhook',
                                          'trigger', 'webhook-stripe', 'type', 'bulk')
           WHEN 4 THEN jsonb_build_object('n', g / 7, 'class', 3, 'steps', 2,
                                          'tokens', 1234, 'usd', 0.0012)
           WHEN 5 THEN jsonb_build_object('channel', 'chat')
           ELSE jsonb_build_object('seq', g / 7, 'class', 3, 'n', g / 7)
       END
FROM generate_series(1, %(rows)s) AS g;
