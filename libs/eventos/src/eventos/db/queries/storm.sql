-- name: storm_edge_ensure
-- The edge's row, created with a full bucket on its first wake.
INSERT INTO storm_edges (sender, target, tokens, updated_at)
VALUES (%(sender)s, %(target)s, %(burst)s, %(now)s)
ON CONFLICT (sender, target) DO NOTHING;

-- name: storm_edge_get
-- The edge's state, locked until the routing transaction commits.
SELECT sender, target, tokens, updated_at, exhausted_windows, last_exhausted_window, breaker,
       opened_at, probe_at, digest_count, digest_due_at, digests_sent, passed, digested,
       suppressed
FROM storm_edges WHERE sender = %(sender)s AND target = %(target)s FOR UPDATE;

-- name: storm_edge_save
-- The edge after one wake: bucket, windows, breaker, and what happened to the wake.
UPDATE storm_edges SET tokens = %(tokens)s, updated_at = %(updated_at)s,
    exhausted_windows = %(exhausted_windows)s, last_exhausted_window = %(last_exhausted_window)s,
    breaker = %(breaker)s, opened_at = %(opened_at)s, probe_at = %(probe_at)s,
    passed = passed + %(passed)s, digested = digested + %(digested)s
WHERE sender = %(sender)s AND target = %(target)s;

-- name: storm_edge_suppressed
-- Count a wake cut as a loop on its edge (the row itself says why, I3).
INSERT INTO storm_edges (sender, target, tokens, updated_at, suppressed)
VALUES (%(sender)s, %(target)s, %(burst)s, %(now)s, 1)
ON CONFLICT (sender, target) DO UPDATE SET suppressed = storm_edges.suppressed + 1;

-- name: storm_digest_add
-- Collect one wake into the edge's digest: counted always, quoted up to a bound; the digest
-- is due one window after its first wake (breaker closed) or 15 minutes after (open).
UPDATE storm_edges SET digest_count = digest_count + 1,
    digest_texts = CASE WHEN jsonb_array_length(digest_texts) < %(texts_max)s
                        THEN digest_texts || jsonb_build_array(%(text)s::text)
                        ELSE digest_texts END,
    digest_hop = GREATEST(digest_hop, %(hop)s),
    digest_path = (SELECT coalesce(jsonb_agg(DISTINCT p), '[]'::jsonb) FROM (
        SELECT jsonb_array_elements_text(digest_path) AS p
        UNION SELECT jsonb_array_elements_text(%(path)s::jsonb)) AS both_paths),
    digest_chain = coalesce(digest_chain, %(chain_id)s),
    digest_due_at = coalesce(digest_due_at, %(due_at)s)
WHERE sender = %(sender)s AND target = %(target)s;

-- name: storm_digests_due
-- Edges whose digest is due, locked (another router skips them).
SELECT sender, target, breaker, digest_count, digest_texts, digest_hop, digest_path,
       digest_chain, digests_sent
FROM storm_edges WHERE digest_count > 0 AND digest_due_at <= %(now)s
ORDER BY digest_due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED;

-- name: storm_digest_sent
-- The digest went into the target's inbox: the buffer starts again.
UPDATE storm_edges SET digest_count = 0, digest_texts = '[]', digest_hop = 0,
    digest_path = '[]', digest_chain = NULL, digest_due_at = NULL,
    digests_sent = digests_sent + 1
WHERE sender = %(sender)s AND target = %(target)s;

-- name: storm_attention_raise
-- Raise an attention item about an edge (breaker open, loop suppressed), or count a repeat
-- on the open one; the admin's (no user's chat is involved).
INSERT INTO attention_items (employee, kind, severity, ref, detail)
VALUES (%(employee)s, %(kind)s, 'warning', %(ref)s, %(detail)s)
ON CONFLICT (kind, ref) WHERE state = 'open' DO UPDATE
    SET count = attention_items.count + 1, last_seen = now(), detail = EXCLUDED.detail;
