-- name: storm_edge_ensure
-- The edge's row, created with a full bucket on its first wake.
INSERT INTO storm_edges (sender, target, tokens, updated_at)
VALUES (%(sender)s, %(target)s, %(burst)s, %(now)s)
ON CONFLICT (sender, target) DO NOTHING;

-- name: storm_edge_get
-- The edge's state, locked until the routing transaction commits.
SELECT sender, target, tokens, updated_at, exhausted_windows, last_exhausted_window, breaker,
       opened_at, probe_at, passed, digested, suppressed
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
-- Collect one wake into the digest of its edge and thread: counted always, quoted up to a
-- bound; the digest is due one window after its first wake (breaker closed) or 15 minutes after
-- (open).
INSERT INTO storm_digests AS d (sender, target, thread, count, texts, hop, path, chain, due_at)
VALUES (%(sender)s, %(target)s, %(thread)s, 1, jsonb_build_array(%(text)s::text), %(hop)s,
        %(path)s, %(chain_id)s, %(due_at)s)
ON CONFLICT (sender, target, thread) DO UPDATE SET count = d.count + 1,
    texts = CASE WHEN jsonb_array_length(d.texts) < %(texts_max)s
                 THEN d.texts || jsonb_build_array(%(text)s::text) ELSE d.texts END,
    hop = GREATEST(d.hop, %(hop)s),
    path = (SELECT coalesce(jsonb_agg(DISTINCT p), '[]'::jsonb) FROM (
        SELECT jsonb_array_elements_text(d.path) AS p
        UNION SELECT jsonb_array_elements_text(%(path)s::jsonb)) AS both_paths),
    chain = coalesce(d.chain, %(chain_id)s),
    due_at = coalesce(d.due_at, %(due_at)s);

-- name: storm_digests_due
-- Digests that are due (with their edge's breaker), locked (another router skips them).
SELECT d.sender, d.target, d.thread, e.breaker, d.count, d.texts, d.hop, d.path, d.chain, d.sent
FROM storm_digests d JOIN storm_edges e ON e.sender = d.sender AND e.target = d.target
WHERE d.count > 0 AND d.due_at <= %(now)s
ORDER BY d.due_at LIMIT %(limit)s FOR UPDATE OF d SKIP LOCKED;

-- name: storm_digest_sent
-- The digest went into the target's inbox: its buffer starts again.
UPDATE storm_digests SET count = 0, texts = '[]', hop = 0, path = '[]', chain = NULL,
    due_at = NULL, sent = sent + 1
WHERE sender = %(sender)s AND target = %(target)s AND thread = %(thread)s;

-- name: storm_attention_raise
-- Raise an attention item about an edge (breaker open, loop suppressed), or count a repeat
-- on the open one; the admin's (no user's chat is involved).
INSERT INTO attention_items (employee, kind, severity, ref, detail)
VALUES (%(employee)s, %(kind)s, 'warning', %(ref)s, %(detail)s)
ON CONFLICT (kind, ref) WHERE state = 'open' DO UPDATE
    SET count = attention_items.count + 1, last_seen = now(), detail = EXCLUDED.detail;
