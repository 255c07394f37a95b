-- Tools stay in their conversation (issue 25 point 2; SPEC §16 EG17). Messages and tasks from
-- employee A land in a thread of B per conversation of A that wrote (`peer_<A>_<origin hash>`),
-- so B's history for one of A's customers never holds another's.
--
-- A task remembers the thread of the assignee it landed in: only a turn of that thread may
-- complete it (the result carries that conversation's work back to the delegating one). Tasks
-- delegated before this change landed in the single `peer_<from>` thread.
ALTER TABLE ipc_tasks ADD COLUMN to_thread text;
UPDATE ipc_tasks SET to_thread = 'peer_' || from_employee;
ALTER TABLE ipc_tasks ALTER COLUMN to_thread SET NOT NULL;

-- The storm guards' token bucket and breaker stay per edge (sender → target: splitting threads
-- must not multiply the allowance, SPEC §10); the digest a held wake collects into is per
-- (edge, thread), so a digest quotes one origin conversation's messages, into that thread only.
CREATE TABLE storm_digests (
    sender     text NOT NULL,
    target     text NOT NULL,
    thread     text NOT NULL,
    count      integer NOT NULL DEFAULT 0,
    texts      jsonb NOT NULL DEFAULT '[]',
    hop        integer NOT NULL DEFAULT 0,
    path       jsonb NOT NULL DEFAULT '[]',
    chain      text,
    due_at     timestamptz,
    sent       integer NOT NULL DEFAULT 0,
    PRIMARY KEY (sender, target, thread)
);
CREATE INDEX storm_digests_due ON storm_digests (due_at) WHERE count > 0;
INSERT INTO storm_digests (sender, target, thread, count, texts, hop, path, chain, due_at, sent)
SELECT sender, target, 'peer_' || sender, digest_count, digest_texts, digest_hop, digest_path,
       digest_chain, digest_due_at, digests_sent
FROM storm_edges WHERE digest_count > 0 OR digests_sent > 0;
DROP INDEX storm_edges_digest_due;
ALTER TABLE storm_edges DROP COLUMN digest_count, DROP COLUMN digest_texts,
    DROP COLUMN digest_hop, DROP COLUMN digest_path, DROP COLUMN digest_chain,
    DROP COLUMN digest_due_at, DROP COLUMN digests_sent;
