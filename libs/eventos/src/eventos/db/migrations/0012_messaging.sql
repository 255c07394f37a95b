-- Employee messaging and storm guards (issue 13; SPEC §10, §15). A delegated task: who asked
-- (employee, generation), whom, what, and where its result goes (`reply_to`: the delegating
-- turn's thread, lane and reply route, so the result continues that conversation). Only the
-- assignee moves it out of `open` (compare-and-swap); its deadline (an alarm of kind `deadline`,
-- ref `task:<id>`) moves it to `timed_out`; `deadline_at` is shown in the task's texts.
-- `hop` and `path` are the delegating turn's causal context (I8): the result carries the hop
-- on and restores the path, as a call that returns.
CREATE TABLE ipc_tasks (
    id               text PRIMARY KEY,
    from_employee    text NOT NULL,
    from_generation  integer NOT NULL,
    to_employee      text NOT NULL,
    task             text NOT NULL,
    status           text NOT NULL DEFAULT 'open'
                     CHECK (status IN ('open', 'done', 'timed_out', 'cancelled')),
    reply_to         jsonb NOT NULL,
    chain_id         text NOT NULL,
    hop              integer NOT NULL,
    path             jsonb NOT NULL DEFAULT '[]',
    deadline_at      timestamptz,
    result           text,
    created_at       timestamptz NOT NULL,
    completed_at     timestamptz
);
CREATE INDEX ipc_tasks_open_from ON ipc_tasks (from_employee) WHERE status = 'open';
-- One row per edge (sender → target) of internal wakes: a token bucket (10/min, burst 20),
-- the exhausted one-minute windows in a row, the breaker, and the digest buffer the edge's
-- messages collect in while they are not delivered one by one. Counters for operators.
CREATE TABLE storm_edges (
    sender                 text NOT NULL,
    target                 text NOT NULL,
    tokens                 double precision NOT NULL,
    updated_at             timestamptz NOT NULL,
    exhausted_windows      integer NOT NULL DEFAULT 0,
    last_exhausted_window  timestamptz,
    breaker                text NOT NULL DEFAULT 'closed'
                           CHECK (breaker IN ('closed', 'open', 'half_open')),
    opened_at              timestamptz,
    probe_at               timestamptz,
    digest_count           integer NOT NULL DEFAULT 0,
    digest_texts           jsonb NOT NULL DEFAULT '[]',
    digest_hop             integer NOT NULL DEFAULT 0,
    digest_path            jsonb NOT NULL DEFAULT '[]',
    digest_chain           text,
    digest_due_at          timestamptz,
    digests_sent           integer NOT NULL DEFAULT 0,
    passed                 bigint NOT NULL DEFAULT 0,
    digested               bigint NOT NULL DEFAULT 0,
    suppressed             bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (sender, target)
);
CREATE INDEX storm_edges_digest_due ON storm_edges (digest_due_at) WHERE digest_count > 0;
-- The 500-pending bound per target counts the target's undelivered ipc inputs.
CREATE INDEX bus_deliveries_open_by_subscription ON bus_deliveries (subscription_id)
    WHERE status IN ('pending', 'held', 'delivered');
