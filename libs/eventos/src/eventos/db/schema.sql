-- The declared schema: what every migration applied in order must produce (a test compares them).

CREATE TABLE employees (
    name              text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9-]{0,39}$'),
    spec              jsonb NOT NULL,
    spec_sha256       text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- Deleted (a tombstone: its history stays for its retention); applying the name revives it.
    deleted_at        timestamptz
);

-- Webhook paths are unique per instance across every applied spec.
CREATE TABLE employee_webhook_paths (
    path        text PRIMARY KEY,
    employee    text NOT NULL REFERENCES employees (name) ON DELETE CASCADE
);

CREATE TABLE generations (
    employee      text NOT NULL REFERENCES employees (name),
    generation    integer NOT NULL CHECK (generation > 0),
    state         text NOT NULL CHECK (state IN ('starting', 'running', 'paused', 'retired')),
    pause_reason  text,
    spec          jsonb NOT NULL,
    spec_sha256   text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    running_at    timestamptz,
    retired_at    timestamptz,
    control_revision  integer NOT NULL DEFAULT 0,
    limits            jsonb NOT NULL DEFAULT '{}',
    start_fired_at    timestamptz,
    PRIMARY KEY (employee, generation)
);
-- At most one live generation per employee.
CREATE UNIQUE INDEX generations_live ON generations (employee) WHERE state <> 'retired';

CREATE TABLE bus_subscriptions (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    employee       text NOT NULL,
    generation     integer NOT NULL,
    trigger_name   text NOT NULL,
    trigger_kind   text NOT NULL,
    event_types    text[] NOT NULL,
    source_key     text NOT NULL,
    filter         jsonb NOT NULL DEFAULT '{}',
    params         jsonb NOT NULL DEFAULT '{}',
    class          smallint NOT NULL CHECK (class BETWEEN 1 AND 5),
    thread_by      text,
    lane           text NOT NULL CHECK (lane IN ('talk', 'customer', 'worker')),
    agent          text NOT NULL,
    debounce       jsonb,
    on_busy        text NOT NULL DEFAULT 'skip',
    reply_capable  boolean NOT NULL,
    FOREIGN KEY (employee, generation) REFERENCES generations (employee, generation),
    UNIQUE (employee, generation, trigger_name)
);
CREATE INDEX bus_subscriptions_source ON bus_subscriptions (source_key);

-- Bodies over 64 KB (SPEC §5): in the database by default, in chunks; `storage_path` is for
-- an external store (NULL for bodies held here).
CREATE TABLE event_blobs (
    id            text PRIMARY KEY,
    sha256        text NOT NULL,
    storage_path  text,
    size          bigint NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_blobs_created ON event_blobs (created_at);

CREATE TABLE event_blob_chunks (
    blob_id  text NOT NULL REFERENCES event_blobs (id) ON DELETE CASCADE,
    n        integer NOT NULL CHECK (n >= 0),
    content  bytea NOT NULL,
    PRIMARY KEY (blob_id, n)
);

CREATE TABLE bus_ingress (
    id            bigserial,
    source_key    text NOT NULL,
    dedupe_key    text NOT NULL,
    type          text NOT NULL,
    class         smallint,
    received_at   timestamptz NOT NULL DEFAULT now(),
    envelope      jsonb,
    body_ref      text,
    size          integer NOT NULL,
    chain_id      text NOT NULL,
    hop           integer NOT NULL DEFAULT 0,
    causation_id  text,
    path          text,
    status        text NOT NULL DEFAULT 'accepted'
                  CHECK (status IN ('accepted', 'routed', 'no_consumer', 'dead', 'expired')),
    dup_count     integer NOT NULL DEFAULT 0,
    error         text,
    routed_at     timestamptz,
    PRIMARY KEY (id, received_at),
    CHECK (envelope IS NOT NULL OR body_ref IS NOT NULL)
) PARTITION BY RANGE (received_at);
-- The router's work list: accepted rows per source, in id order.
CREATE INDEX bus_ingress_accepted ON bus_ingress (source_key, id) WHERE status = 'accepted';

-- Kept apart from the partitioned table so the check spans days (SPEC §5).
CREATE TABLE bus_dedupe (
    source_key    text NOT NULL,
    dedupe_key    text NOT NULL,
    ingress_id    bigint NOT NULL,
    received_at   timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (source_key, dedupe_key)
);
CREATE INDEX bus_dedupe_expires ON bus_dedupe (expires_at);

CREATE TABLE bus_streams (
    stream_key         text PRIMARY KEY,
    employee           text NOT NULL,
    generation         integer NOT NULL,
    lane               text NOT NULL,
    thread             text NOT NULL,
    next_seq           bigint NOT NULL DEFAULT 1,
    delivered_seq      bigint NOT NULL DEFAULT 0,
    consumed_seq       bigint NOT NULL DEFAULT 0,
    top_pending_class  smallint,
    oldest_pending_at  timestamptz,
    hold_reason        text,
    entity_id          text NOT NULL,
    state              text NOT NULL DEFAULT 'active',
    updated_at         timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (employee, generation) REFERENCES generations (employee, generation)
);
CREATE INDEX bus_streams_generation ON bus_streams (employee, generation);
-- The relay's work list: streams with pending input, by class then age.
CREATE INDEX bus_streams_pending ON bus_streams (top_pending_class, oldest_pending_at)
    WHERE top_pending_class IS NOT NULL;

CREATE TABLE bus_deliveries (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_key           text NOT NULL REFERENCES bus_streams (stream_key),
    seq                  bigint NOT NULL,
    ingress_id           bigint NOT NULL,
    ingress_received_at  timestamptz NOT NULL,
    subscription_id      bigint NOT NULL REFERENCES bus_subscriptions (id),
    route                jsonb NOT NULL,
    class                smallint NOT NULL,
    thread               text NOT NULL,
    type                 text NOT NULL,
    payload              jsonb,
    body_ref             text,
    size                 integer NOT NULL,
    chain_id             text NOT NULL,
    hop                  integer NOT NULL,
    causation_id         text,
    status               text NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'held', 'delivered', 'done', 'failed', 'dead')),
    reason               text,
    attempts             integer NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream_key, seq),
    -- Routing is exactly once: one delivery per (ingress row, subscription).
    UNIQUE (ingress_id, subscription_id)
);
CREATE INDEX bus_deliveries_open ON bus_deliveries (stream_key, seq)
    WHERE status IN ('pending', 'held');
-- The retention sweep keeps a blob 90 days while a dead delivery refers to it (replayable).
CREATE INDEX bus_deliveries_body_ref ON bus_deliveries (body_ref) WHERE body_ref IS NOT NULL;

CREATE TABLE bus_leases (
    name           text PRIMARY KEY,
    owner          text NOT NULL,
    until          timestamptz NOT NULL,
    fencing_token  bigint NOT NULL DEFAULT 1
);

CREATE TABLE channel_accounts (
    id              text PRIMARY KEY,
    driver          text NOT NULL,
    external_id     text NOT NULL,
    credential_ref  text NOT NULL,
    status          text NOT NULL DEFAULT 'idle',
    cursor          jsonb NOT NULL DEFAULT '{}',
    lease_owner     text,
    lease_until     timestamptz,
    last_seen_at    timestamptz
);

CREATE TABLE chat_messages (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    employee           text NOT NULL REFERENCES employees (name),
    session            text NOT NULL,
    client_message_id  text NOT NULL,
    text               text NOT NULL,
    status             text NOT NULL DEFAULT 'queued'
                       CHECK (status IN ('queued', 'delivered', 'answered', 'dead')),
    ingress_id         bigint NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    turn_id            text,
    UNIQUE (employee, session, client_message_id)
);
CREATE INDEX chat_messages_pending ON chat_messages (employee, session) WHERE status = 'queued';

CREATE TABLE conversations (
    employee          text NOT NULL,
    generation        integer NOT NULL,
    agent             text NOT NULL,
    thread            text NOT NULL,
    stream_key        text NOT NULL REFERENCES bus_streams (stream_key),
    next_turn         integer NOT NULL DEFAULT 1,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- The transcript's rows (transcript_messages, 0015): how many, and their bytes.
    transcript_n      bigint NOT NULL DEFAULT 0,
    transcript_total  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (employee, generation, agent, thread),
    FOREIGN KEY (employee, generation) REFERENCES generations (employee, generation)
);

CREATE TABLE turns (
    id            text PRIMARY KEY,
    employee      text NOT NULL,
    generation    integer NOT NULL,
    agent         text NOT NULL,
    thread        text NOT NULL,
    n             integer NOT NULL,
    class         smallint NOT NULL,
    stream_key    text NOT NULL,
    status        text NOT NULL DEFAULT 'running'
                  CHECK (status IN ('running', 'done', 'failed', 'cancelled', 'interrupted')),
    consumed_seq  bigint,
    started_at    timestamptz NOT NULL DEFAULT now(),
    ended_at      timestamptz,
    error         text,
    -- The watchdog's view: the last completed step, the time held without a slot (suspended or
    -- parked), what the watchdog already did.
    last_step_at     timestamptz,
    held_s           double precision NOT NULL DEFAULT 0,
    slow_alerted_at  timestamptz,
    backstop_at      timestamptz,
    admission_wait_s double precision,  -- from the entity's first ask to the grant
    parked_at        timestamptz,  -- first park since its last completed step
    UNIQUE (employee, generation, agent, thread, n)
);
CREATE INDEX turns_running ON turns (started_at) WHERE status = 'running';

-- Admission (SPEC §9): one row per admitted turn while it holds a slot.
CREATE TABLE sched_leases (
    turn_id     text PRIMARY KEY,
    employee    text NOT NULL,
    class       smallint NOT NULL,
    state       text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended')),
    granted_at  timestamptz NOT NULL DEFAULT now(),
    reserved    boolean NOT NULL DEFAULT false,  -- the employee's reserved owner slot
    stream_key  text,
    suspended_reason text,
    suspended_at timestamptz
);
CREATE INDEX sched_leases_active ON sched_leases (employee) WHERE state = 'active';

CREATE TABLE outbound_messages (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key      text NOT NULL UNIQUE,
    employee             text NOT NULL,
    thread               text NOT NULL,
    turn_id              text NOT NULL,
    account              text,
    recipient            bytea,  -- nonce ‖ AES-GCM ciphertext, sealed by the services (0009)
    kind                 text NOT NULL,
    class                smallint NOT NULL,
    body                 text,
    body_ref             text,
    status               text NOT NULL DEFAULT 'queued'
                         CHECK (status IN ('held', 'queued', 'sending', 'sent', 'failed', 'unknown',
                                           'expired')),
    approval_id          text,
    held_reason          text,
    not_before           timestamptz,
    claim_token          text,
    provider_called_at   timestamptz,
    provider_message_id  text,
    receipt              jsonb,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbound_messages_open ON outbound_messages (status) WHERE status IN ('queued', 'sending');

CREATE TABLE chat_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    employee     text NOT NULL,
    session      text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('run.start', 'run.input_merged', 'reply', 'notice')),
    turn_id      text NOT NULL,
    dedupe_key   text NOT NULL UNIQUE,
    outbound_id  bigint UNIQUE REFERENCES outbound_messages (id),
    message_ids  bigint[] NOT NULL DEFAULT '{}',
    text         text,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX chat_events_session ON chat_events (employee, session, id);

CREATE TABLE attention_items (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    employee    text NOT NULL,
    kind        text NOT NULL,
    severity    text NOT NULL CHECK (severity IN ('info', 'warning', 'error')),
    ref         text NOT NULL,
    detail      text,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    count       integer NOT NULL DEFAULT 1,
    state       text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'resolved'))
);
CREATE UNIQUE INDEX attention_items_open ON attention_items (kind, ref) WHERE state = 'open';

-- An owner action that needs Temporal: written with the database change, answered at once,
-- applied in the background by workflow id with a stable Update id (`intent-<id>`).
CREATE TABLE intents (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    employee         text REFERENCES employees (name),  -- NULL: instance-wide (rearm)
    generation       integer,
    kind             text NOT NULL
                     CHECK (kind IN ('start', 'stop', 'resume', 'reset', 'interrupt', 'limits',
                                     'rearm')),
    revision         integer,  -- the control revision a supervisor intent sets
    payload          jsonb NOT NULL DEFAULT '{}',
    state            text NOT NULL DEFAULT 'applying'
                     CHECK (state IN ('applying', 'applied', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    outcome          text,  -- what applying did, or the last attempt's error
    created_at       timestamptz NOT NULL DEFAULT now(),
    applied_at       timestamptz
);
-- The deliverer's work list: the open intents, oldest first per employee.
CREATE INDEX intents_applying ON intents (employee, id) WHERE state = 'applying';

-- Each time a lost supervisor was started again from the database.
CREATE TABLE supervisor_rebuilds (
    employee    text NOT NULL,
    generation  integer NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (employee, generation) REFERENCES generations (employee, generation)
);
CREATE INDEX supervisor_rebuilds_recent ON supervisor_rebuilds (employee, generation, at);

-- Scheduler and budgets (SPEC §9).
-- An entity waiting for a slot (one per stream: an entity asks for one turn at a time).
CREATE TABLE sched_waiters (
    stream_key    text PRIMARY KEY,
    employee      text NOT NULL,
    generation    integer NOT NULL,
    agent         text NOT NULL,
    thread        text NOT NULL,
    class         smallint NOT NULL,
    workflow_id   text NOT NULL,  -- the entity that is woken with `wake`
    turn_id       text,           -- a suspended turn asking for its slot again
    requested_at  timestamptz NOT NULL DEFAULT now(),
    asked_at      timestamptz NOT NULL DEFAULT now(),
    offered_at    timestamptz,
    -- it takes what the relay held for it when granted (eventos.delivery.held): the relay
    -- sends it no input of its class or below while it waits
    takes_held    boolean NOT NULL DEFAULT false
);

-- Round-robin between employees within a class: who was served last (NULL: never), and the
-- head of the employee's queue in the class (its oldest waiter not offered a slot; NULL: none
-- waits), kept by the trigger below, so a pass reads the next employees in turn from one index.
CREATE TABLE sched_rounds (
    class      smallint NOT NULL,
    employee   text NOT NULL,
    served_at  timestamptz,
    head_at    timestamptz,
    head_key   text,
    PRIMARY KEY (class, employee)
);
CREATE INDEX sched_rounds_turns ON sched_rounds (class, served_at NULLS FIRST, head_at, head_key)
    WHERE head_at IS NOT NULL;

-- An employee's waiters in a class, oldest first (the heads, and a pass's picks); offered
-- slots (the load, lapsing offers); silent waiters; the console's list, oldest first.
CREATE INDEX sched_waiters_queue ON sched_waiters (class, employee, requested_at, stream_key)
    WHERE offered_at IS NULL;
CREATE INDEX sched_waiters_offered ON sched_waiters (offered_at) WHERE offered_at IS NOT NULL;
CREATE INDEX sched_waiters_asked ON sched_waiters (asked_at);
CREATE INDEX sched_waiters_requested ON sched_waiters (requested_at);

-- The turns admitted in the share window, by class (floors), without reading every turn.
CREATE INDEX turns_started ON turns (started_at, class);

CREATE FUNCTION sched_head_refresh(k smallint, e text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO sched_rounds AS r (class, employee, head_at, head_key)
    SELECT k, e, h.requested_at, h.stream_key
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (
        SELECT w.requested_at, w.stream_key FROM sched_waiters w
        WHERE w.class = k AND w.employee = e AND w.offered_at IS NULL
        ORDER BY w.requested_at, w.stream_key
        LIMIT 1
    ) h ON true
    ON CONFLICT (class, employee) DO UPDATE
        SET head_at = EXCLUDED.head_at, head_key = EXCLUDED.head_key
        WHERE (r.head_at, r.head_key) IS DISTINCT FROM (EXCLUDED.head_at, EXCLUDED.head_key);
$$;

CREATE FUNCTION sched_waiters_head() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM sched_head_refresh(OLD.class, OLD.employee);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE'
            AND (NEW.class, NEW.employee) IS DISTINCT FROM (OLD.class, OLD.employee)) THEN
        PERFORM sched_head_refresh(NEW.class, NEW.employee);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER sched_waiters_head_in_out AFTER INSERT OR DELETE ON sched_waiters
    FOR EACH ROW EXECUTE FUNCTION sched_waiters_head();
-- An ask again only touches `asked_at` (and rewrites the other columns to their values).
CREATE TRIGGER sched_waiters_head_moved AFTER UPDATE ON sched_waiters
    FOR EACH ROW
    WHEN ((OLD.class, OLD.employee, OLD.requested_at, OLD.offered_at)
          IS DISTINCT FROM (NEW.class, NEW.employee, NEW.requested_at, NEW.offered_at))
    EXECUTE FUNCTION sched_waiters_head();

-- The daily budget of an employee: its limit, its period (the owner's midnight plus a stable
-- offset of 0-10 minutes, as UTC instants) and the ledger's state.
CREATE TABLE employee_budgets (
    employee      text PRIMARY KEY REFERENCES employees (name),
    daily_usd     numeric(12, 4),  -- NULL: no limit
    timezone      text NOT NULL,
    offset_s      integer NOT NULL CHECK (offset_s BETWEEN 0 AND 600),
    period_start  timestamptz NOT NULL,
    period_end    timestamptz NOT NULL,
    state         text NOT NULL DEFAULT 'normal' CHECK (state IN ('normal', 'high', 'max')),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE employee_spend (
    employee      text NOT NULL REFERENCES employees (name),
    period_start  timestamptz NOT NULL,
    reserved_usd  numeric(14, 6) NOT NULL DEFAULT 0,
    spent_usd     numeric(14, 6) NOT NULL DEFAULT 0,
    PRIMARY KEY (employee, period_start)
);

-- One row per paid attempt: the key makes a retried reservation or settlement count once.
CREATE TABLE spend_events (
    key            text PRIMARY KEY,  -- {workflow_id}:{activity_id}[:{attempt}]
    employee       text NOT NULL,
    period_start   timestamptz NOT NULL,
    turn_id        text NOT NULL,
    class          smallint NOT NULL,
    model          text NOT NULL,
    estimate_usd   numeric(14, 6) NOT NULL,
    actual_usd     numeric(14, 6),
    input_tokens   integer,
    output_tokens  integer,
    state          text NOT NULL DEFAULT 'reserved'
                   CHECK (state IN ('reserved', 'settled', 'released')),
    created_at     timestamptz NOT NULL DEFAULT now(),
    settled_at     timestamptz
);
CREATE INDEX spend_events_turn ON spend_events (turn_id);

-- Provider rate limits (SPEC §9): a token bucket per credential and class (requests and tokens
-- per minute from configuration), shared by every LLM worker; a credential paused by a 429
-- with Retry-After waits for every class.
CREATE TABLE provider_buckets (
    credential   text NOT NULL,
    class        smallint NOT NULL,
    requests     double precision NOT NULL,
    tokens       double precision NOT NULL,
    refilled_at  timestamptz NOT NULL,
    PRIMARY KEY (credential, class)
);

CREATE TABLE provider_pauses (
    credential  text PRIMARY KEY,
    until       timestamptz NOT NULL,
    reason      text NOT NULL
);

-- Users and audiences (issue 11).
-- A user of the owner API: its token is shown once and only its sha256 is kept; its owner chat
-- is its own conversation, on thread `thread` (`u_` and 16 hex of a hash of the name).
CREATE TABLE users (
    name          text PRIMARY KEY,
    thread        text NOT NULL UNIQUE,
    token_sha256  text NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Owner chat belongs to an audience: a user's name, or `owner` (the admin). Sessions are per
-- audience, so two users' same session name and client id never meet.
ALTER TABLE chat_messages ADD COLUMN audience text NOT NULL DEFAULT 'owner';
ALTER TABLE chat_messages DROP CONSTRAINT chat_messages_employee_session_client_message_id_key;
ALTER TABLE chat_messages ADD CONSTRAINT chat_messages_client_id
    UNIQUE (employee, audience, session, client_message_id);
DROP INDEX chat_messages_pending;
CREATE INDEX chat_messages_pending ON chat_messages (employee, audience, session)
    WHERE status = 'queued';
ALTER TABLE chat_events ADD COLUMN audience text NOT NULL DEFAULT 'owner';
DROP INDEX chat_events_session;
CREATE INDEX chat_events_session ON chat_events (employee, audience, session, id);

-- Approvals (held outbox rows) and attention items carry their audience: the user whose chat
-- they came from (who sees them besides the admin), or NULL for the admin alone.
ALTER TABLE outbound_messages ADD COLUMN audience text;
ALTER TABLE attention_items ADD COLUMN audience text;

-- Private data (issue 11): the outbox recipient sealed at rest (AES-GCM, bound to its row); the
-- key id names the key that sealed it, so keys can rotate.
ALTER TABLE outbound_messages
    ADD COLUMN recipient_key_id text,
    ADD CONSTRAINT outbound_messages_recipient_sealed
        CHECK ((recipient IS NULL) = (recipient_key_id IS NULL));

-- Tools (issue 13).
CREATE TABLE tool_calls (
    id          text PRIMARY KEY,
    employee    text NOT NULL,
    generation  integer NOT NULL,
    lane        text NOT NULL,
    thread      text NOT NULL,
    route       jsonb NOT NULL,
    turn_id     text NOT NULL,
    name        text NOT NULL,
    effect      text NOT NULL CHECK (effect IN ('read_only', 'idempotent', 'unsafe')),
    arguments   jsonb NOT NULL,
    status      text NOT NULL CHECK (status IN ('calling', 'done', 'unknown')),
    outcome     text,
    result      text,
    attempts    integer NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    called_at   timestamptz,
    finished_at timestamptz,
    retry_of    text
);
CREATE INDEX tool_calls_employee ON tool_calls (employee, created_at);
ALTER TABLE attention_items ADD COLUMN action text;

-- Poll triggers (issue 13): a poll trigger's cursor, advanced in the transaction that appends
-- its page; failures and the next interval (doubled by failures up to an hour); `revision`
-- fences a stale attempt.
CREATE TABLE poll_cursors (
    employee        text NOT NULL,
    generation      integer NOT NULL,
    trigger_name    text NOT NULL,
    cursor          text,
    failures        integer NOT NULL DEFAULT 0,
    interval_s      integer NOT NULL,
    revision        bigint NOT NULL DEFAULT 0,
    appended        bigint NOT NULL DEFAULT 0,
    skipped         bigint NOT NULL DEFAULT 0,
    last_polled_at  timestamptz,
    last_error      text,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (employee, generation, trigger_name),
    FOREIGN KEY (employee, generation) REFERENCES generations (employee, generation)
);

-- Watched data (issue 13 point 7).
CREATE TABLE data_records (
    store       text NOT NULL CHECK (store ~ '^[a-z][a-z0-9-]{0,39}$'),
    key         text COLLATE "C" NOT NULL CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$'),
    value       jsonb NOT NULL,
    version     bigint NOT NULL CHECK (version > 0),
    updated_by  text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store, key)
);
-- One row per store: its key count, the bound's counter (I3). Locked by a write that adds a
-- key, so two writers cannot both take the last free key.
CREATE TABLE data_stores (
    store       text PRIMARY KEY,
    keys        integer NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- The router's coalescing state (level-triggered): per (watch subscription, subject) the
-- delivery that still stands for it. A subject is a record key, or '*' for the store's resync.
-- A row whose delivery has left `pending`/`held` is stale and is replaced or pruned.
CREATE TABLE watch_pending (
    subscription_id  bigint NOT NULL REFERENCES bus_subscriptions (id),
    subject          text COLLATE "C" NOT NULL,
    stream_key       text NOT NULL,
    seq              bigint NOT NULL,
    coalesced        integer NOT NULL DEFAULT 0,
    last_version     bigint,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription_id, subject)
);

-- Employee messaging and storm guards (issue 13; SPEC §10, §15). A delegated task: who asked
-- (employee, generation), whom, what, and where its result goes (`reply_to`: the delegating
-- turn's thread, lane and reply route, so the result continues that conversation). Only the
-- assignee moves it out of `open` (compare-and-swap); its deadline (an alarm of kind `deadline`,
-- ref `task:<id>`) moves it to `timed_out`; `deadline_at` is shown in the task's texts.
-- `hop` and `path` are the delegating turn's causal context (I8): the result carries the hop
-- on and restores the path, as a call that returns. `to_thread` is the assignee's thread the
-- task landed in (one per conversation of the delegator): only a turn there completes it.
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
    completed_at     timestamptz,
    to_thread        text NOT NULL
);
CREATE INDEX ipc_tasks_open_from ON ipc_tasks (from_employee) WHERE status = 'open';
-- One row per edge (sender → target) of internal wakes: a token bucket (10/min, burst 20),
-- the exhausted one-minute windows in a row and the breaker (the digest buffers the edge's
-- messages collect in while they are not delivered one by one are in storm_digests, per
-- thread). Counters for operators.
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
    passed                 bigint NOT NULL DEFAULT 0,
    digested               bigint NOT NULL DEFAULT 0,
    suppressed             bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (sender, target)
);
-- The digest of one edge's held wakes of one thread of the target (issue 25): the bucket and
-- breaker stay per edge (splitting threads must not multiply the allowance), the quoted texts
-- go only to the thread of the origin conversation that wrote them.
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
-- The 500-pending bound per target counts the target's undelivered ipc inputs.
CREATE INDEX bus_deliveries_open_by_subscription ON bus_deliveries (subscription_id)
    WHERE status IN ('pending', 'held', 'delivered');

-- Alarms and follow-ups (issue 13).
CREATE TABLE alarms (
    id           text PRIMARY KEY,
    employee     text NOT NULL,
    generation   integer NOT NULL,
    kind         text NOT NULL DEFAULT 'alarm' CHECK (kind IN ('alarm', 'deadline')),
    ref          text,
    lane         text NOT NULL,
    thread       text NOT NULL,
    route        jsonb NOT NULL,
    agent        text NOT NULL,
    text         text NOT NULL,
    payload      jsonb NOT NULL DEFAULT '{}',
    due_at       timestamptz NOT NULL,
    status       text NOT NULL DEFAULT 'scheduled'
                 CHECK (status IN ('scheduled', 'fired', 'missed', 'cancelled')),
    if_late      text NOT NULL DEFAULT 'fire',
    skip_after_s double precision CHECK (skip_after_s > 0),
    cancel_on    text CHECK (cancel_on IN ('inbound')),
    repeat       jsonb,
    occurrence   integer NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL DEFAULT now(),
    fired_at     timestamptz,
    settled_at   timestamptz,
    chain_id     text NOT NULL,
    hop          integer NOT NULL DEFAULT 0,
    path         jsonb NOT NULL DEFAULT '[]',
    causation_id text
);
-- The supervisor's next deadline and fire_due's batch.
CREATE INDEX alarms_due ON alarms (employee, generation, due_at) WHERE status = 'scheduled';
-- The router's follow-up cancel (one per inbound delivery).
CREATE INDEX alarms_follow_ups ON alarms (employee, generation, lane, thread)
    WHERE status = 'scheduled' AND cancel_on = 'inbound';
-- cancel_by_ref (a deadline's owner settles it).
CREATE INDEX alarms_ref ON alarms (employee, kind, ref) WHERE status = 'scheduled';
-- The transcript as rows (issue 12); see 0015_transcript_messages.sql.
CREATE TABLE transcript_messages (
    employee     text NOT NULL,
    generation   integer NOT NULL,
    agent        text NOT NULL,
    thread       text NOT NULL,
    n            bigint NOT NULL CHECK (n > 0),
    start_bytes  bigint NOT NULL,
    bytes        integer NOT NULL,
    message      jsonb NOT NULL,
    turn_id      text,
    PRIMARY KEY (employee, generation, agent, thread, n),
    FOREIGN KEY (employee, generation, agent, thread)
        REFERENCES conversations (employee, generation, agent, thread) ON DELETE CASCADE
);
CREATE INDEX transcript_messages_bytes
    ON transcript_messages (employee, generation, agent, thread, start_bytes);
-- Chat event wake-ups (issue 12); see 0016_chat_wakeups.sql.
CREATE FUNCTION chat_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('eventos_chat_events', NEW.employee);
    RETURN NULL;
END
$$;
CREATE TRIGGER chat_events_notify AFTER INSERT ON chat_events
    FOR EACH ROW EXECUTE FUNCTION chat_events_notify();
-- Channels and safe egress (issue 14); see 0017_channels.sql.
ALTER TABLE channel_accounts ALTER COLUMN external_id SET DEFAULT '';
ALTER TABLE channel_accounts ADD COLUMN fencing bigint NOT NULL DEFAULT 0;
ALTER TABLE channel_accounts ADD COLUMN down_since timestamptz;
ALTER TABLE channel_accounts ADD COLUMN error text;
ALTER TABLE channel_accounts ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE channel_accounts ADD CONSTRAINT channel_accounts_status
    CHECK (status IN ('idle', 'up', 'down'));

-- Values made once per instance (the salt of customer thread ids), never shown.
CREATE TABLE instance_secrets (
    name        text PRIMARY KEY,
    value       bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Egress token buckets (SPEC §11): one per channel account and one per recipient (keyed by the
-- recipient's salted hash, never the address), shared by every egress replica.
CREATE TABLE egress_buckets (
    key           text PRIMARY KEY,
    tokens        double precision NOT NULL,
    refilled_at   timestamptz NOT NULL,
    paused_until  timestamptz  -- a provider's 429 with a retry hint pauses the whole bucket
);

-- A send's claim is dated (it expires with the activity's attempt), a failure keeps its reason,
-- an owner's Retry of an `unknown` send is dated until the egress sends it, and provider calls
-- are counted (an idempotent provider's unclear answers are retried a few times, then `unknown`).
ALTER TABLE outbound_messages ADD COLUMN claimed_at timestamptz;
ALTER TABLE outbound_messages ADD COLUMN error text;
ALTER TABLE outbound_messages ADD COLUMN retry_requested_at timestamptz;
ALTER TABLE outbound_messages ADD COLUMN attempts integer NOT NULL DEFAULT 0;
CREATE INDEX outbound_messages_retries ON outbound_messages (retry_requested_at)
    WHERE status = 'queued' AND retry_requested_at IS NOT NULL;
CREATE INDEX outbound_messages_account_open ON outbound_messages (account)
    WHERE status IN ('queued', 'sending');
-- Approvals (issue 14); see 0018_approvals.sql.
CREATE SEQUENCE approvals_decision_seq;
CREATE TABLE approvals (
    id            text PRIMARY KEY,
    employee      text NOT NULL,
    generation    integer NOT NULL,
    thread        text NOT NULL,
    turn_id       text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('send', 'tool')),
    outbound_id   bigint UNIQUE REFERENCES outbound_messages (id),  -- a send's
    tool_call     text UNIQUE,  -- a tool call's key (`<turn>:<call id>`)
    draft         text,  -- a tool call's name and arguments, shown to whoever decides
    audience      text,  -- the user whose chat it answers (who may decide it, with the admin)
    state         text NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'approved', 'declined', 'expired')),
    expires_at    timestamptz NOT NULL,
    reminded_at   timestamptz,
    decided_at    timestamptz,
    decided_by    text,
    decision_seq  bigint,
    taken_at      timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX approvals_open ON approvals (employee, state) WHERE taken_at IS NULL;
CREATE INDEX approvals_turn ON approvals (turn_id);  -- a turn's approvals (waiting)

ALTER TABLE intents DROP CONSTRAINT intents_kind_check;
ALTER TABLE intents ADD CONSTRAINT intents_kind_check
    CHECK (kind IN ('start', 'stop', 'resume', 'reset', 'interrupt', 'limits', 'rearm',
                    'approval'));

-- WhatsApp Business (issue 14): the 24-hour customer-service window. Each customer's last
-- inbound message per account (the customer by its salted hash, never the number), written in
-- the transaction that appends the message; the sender holds a reply outside the window.
CREATE TABLE whatsapp_windows (
    account          text NOT NULL,  -- whatsapp_business:<account>
    counterpart      text NOT NULL,  -- eventos.channels.threads.counterpart_hash
    last_inbound_at  timestamptz NOT NULL,
    last_wamid       text NOT NULL,  -- the reply's context.message_id
    PRIMARY KEY (account, counterpart)
);

-- Delivery statuses find their sent row by the provider's message id.
CREATE INDEX outbound_messages_provider_id ON outbound_messages (provider_message_id)
    WHERE provider_message_id IS NOT NULL;

-- Supervision (SPEC §12, issue 16): restart intensity per thread (backoff, quarantine), the
-- `degraded` employee, and the indexes the watchdogs read.

-- A timed hold ends at `hold_until` (`backoff`; NULL for every other hold). The relay gates
-- on `hold_reason`; the why-waiting view reads both.
ALTER TABLE bus_streams ADD COLUMN hold_until timestamptz;
CREATE INDEX bus_streams_held ON bus_streams (hold_reason, hold_until)
    WHERE hold_reason IS NOT NULL;

-- A thread's restart intensity, counted on its failed turns (`turns.status = 'failed'`).
CREATE TABLE thread_health (
    stream_key        text PRIMARY KEY REFERENCES bus_streams (stream_key),
    employee          text NOT NULL,
    last_failed_turn  text,  -- the last failed turn counted (counting it again is a no-op)
    backoff_step      smallint NOT NULL DEFAULT 0,  -- backoffs in a row: 1, 5, then 30 minutes
    backoff_at        timestamptz,  -- when the last backoff began
    backoff_until     timestamptz,  -- admission refuses a turn before it
    quarantined_at    timestamptz,  -- admission refuses every turn until the owner releases it
    failures_from     timestamptz,  -- failed turns before this do not count (the last release)
    released_at       timestamptz,
    wake_pending      boolean NOT NULL DEFAULT false  -- released: the relay wakes its entity
);
-- The relay's pass reads the quarantined threads and the entities to wake, every few seconds.
CREATE INDEX thread_health_quarantined ON thread_health (employee)
    WHERE quarantined_at IS NOT NULL;
CREATE INDEX thread_health_wake ON thread_health (stream_key) WHERE wake_pending;

-- An employee's health: `degraded` while too many turns fail (or 3 threads are quarantined).
CREATE TABLE employee_health (
    employee        text PRIMARY KEY,
    degraded_since  timestamptz,  -- NULL: not degraded
    reason          text,
    window_from     timestamptz,  -- turns before this do not count (the owner's last clear)
    cleared_at      timestamptz,
    cleared_by      text,  -- `recovered` (the window recovered) or `owner`
    wake_pending    boolean NOT NULL DEFAULT false  -- cleared: the relay wakes its entities
);

-- Failed turns per thread in a window, turns per employee in a window, a stream's turns.
CREATE INDEX turns_stream_ended ON turns (stream_key, ended_at);
CREATE INDEX turns_ended ON turns (ended_at) WHERE status IN ('done', 'failed');

-- Operator surfaces (issue 16); see 0021_operator.sql.
-- A replay (SPEC §5 `replay(selector)`) is a new ingress row in the original's source under its
-- own dedupe key (`replay:<letter id>`), naming the letter it replays (`replay_of`). A dead
-- delivery goes back to the one trigger it died in (`replay_employee`, `replay_trigger`: that
-- employee's live generation), not to every subscriber of its source anew. The letter records
-- when it was replayed and as which row, so nothing is replayed twice.
ALTER TABLE bus_ingress
    ADD COLUMN replay_of text,
    ADD COLUMN replay_employee text,
    ADD COLUMN replay_trigger text,
    ADD COLUMN replayed_at timestamptz,
    ADD COLUMN replayed_as bigint;
ALTER TABLE bus_deliveries
    ADD COLUMN replayed_at timestamptz,
    ADD COLUMN replayed_as bigint;
-- The dead letters, newest first (an ingress row died when it was routed, else on arrival).
CREATE INDEX bus_ingress_dead ON bus_ingress ((coalesce(routed_at, received_at)), id)
    WHERE status = 'dead';
CREATE INDEX bus_deliveries_dead ON bus_deliveries (updated_at, id) WHERE status = 'dead';

-- Attention items may be acknowledged: `acked` stays listed until resolved, and a repeat
-- counts on it as on an open one (the unique index covers both states, so every raise's
-- `ON CONFLICT (kind, ref) WHERE state = 'open'` lands on the acked row too).
ALTER TABLE attention_items DROP CONSTRAINT attention_items_state_check;
ALTER TABLE attention_items ADD CONSTRAINT attention_items_state_check
    CHECK (state IN ('open', 'acked', 'resolved'));
ALTER TABLE attention_items
    ADD COLUMN acked_at timestamptz,
    ADD COLUMN acked_by text,
    ADD COLUMN resolved_at timestamptz,
    ADD COLUMN resolved_by text;  -- NULL: its cause went away (or an action settled it)
DROP INDEX attention_items_open;
CREATE UNIQUE INDEX attention_items_open ON attention_items (kind, ref)
    WHERE state IN ('open', 'acked');
-- The attention list, newest first, by state.
CREATE INDEX attention_items_listed ON attention_items (state, id);

-- The employee timeline and the relays' Temporal breakers (issue 16); see 0022_timeline.sql.
CREATE TABLE employee_timeline (
    id        bigint GENERATED ALWAYS AS IDENTITY,
    employee  text NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind      text NOT NULL,
    thread    text,
    chains    text[] NOT NULL DEFAULT '{}',
    ref       text,
    detail    jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX employee_timeline_at ON employee_timeline (employee, at, id);
CREATE INDEX employee_timeline_thread ON employee_timeline (employee, thread, at, id);
CREATE INDEX employee_timeline_kind ON employee_timeline (employee, kind, at, id);
-- A chain's entries are few (hops ≤ 8, fan-out ≤ 50): found through the chain, then sorted.
-- fastupdate off: no pending list whose flush would land on one hot-path insert.
CREATE INDEX employee_timeline_chains ON employee_timeline USING gin (chains)
    WITH (fastupdate = off);
CREATE INDEX employee_timeline_age ON employee_timeline USING brin (at);

-- The chains of a turn's inputs: set when the turn loads them, completed by its consuming save.
ALTER TABLE turns ADD COLUMN chains text[];

-- The relay's Temporal breaker, as each relay last said (the request path reads it, never
-- Temporal, I2): refreshed at every failed probe while open, so a row not refreshed for a while
-- belongs to a relay that is gone.
CREATE TABLE relay_breakers (
    relay_id    text PRIMARY KEY,
    open        boolean NOT NULL,
    opened_at   timestamptz,
    probe_at    timestamptz,
    error       text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Deliveries: the router's statement adds them (accepted at the ingress row's time, routed
-- now); one set-based insert per statement, not a call per row.
CREATE FUNCTION timeline_deliveries_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, at, kind, thread, chains, ref, detail)
    SELECT split_part(d.stream_key, '/', 1), e.at, e.kind, d.thread, ARRAY[d.chain_id],
           d.id::text,
           jsonb_build_object('seq', d.seq, 'class', d.class, 'type', d.type,
                              'source', d.route ->> 'kind', 'trigger', d.route ->> 'trigger',
                              'from', d.route ->> 'from', 'ingress', d.ingress_id,
                              'lane', split_part(d.stream_key, '/', 3))
    FROM added d
    CROSS JOIN LATERAL (VALUES (d.ingress_received_at, 'input.accepted'),
                               (clock_timestamp(), 'input.routed')) AS e(at, kind);
    RETURN NULL;
END
$$;
CREATE TRIGGER bus_deliveries_timeline_added AFTER INSERT ON bus_deliveries
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION timeline_deliveries_added();

-- A delivery's status moves: delivered (the relay's commit), dead (with its reason's code),
-- skipped (`on_busy: skip`), pending again. Consumed inputs are told by their turn's entry.
CREATE FUNCTION timeline_deliveries_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, at, kind, thread, chains, ref, detail)
    SELECT split_part(n.stream_key, '/', 1), clock_timestamp(),
           CASE n.status WHEN 'delivered' THEN 'input.delivered' WHEN 'dead' THEN 'input.dead'
                         WHEN 'pending' THEN 'input.pending' ELSE 'input.skipped' END,
           n.thread, ARRAY[n.chain_id], n.id::text,
           jsonb_build_object('seq', n.seq, 'class', n.class, 'attempts', n.attempts,
                              'reason', left(split_part(n.reason, ':', 1), 80))
    FROM moved_to n JOIN moved_from o ON o.id = n.id
    WHERE o.status IS DISTINCT FROM n.status
      AND (n.status IN ('delivered', 'dead', 'pending')
           OR (n.status = 'done' AND n.reason LIKE 'skipped:%'));
    RETURN NULL;
END
$$;
CREATE TRIGGER bus_deliveries_timeline_moved AFTER UPDATE ON bus_deliveries
    REFERENCING OLD TABLE AS moved_from NEW TABLE AS moved_to
    FOR EACH STATEMENT EXECUTE FUNCTION timeline_deliveries_moved();

-- A turn ended: done (its consuming save), failed, cancelled or interrupted, with its steps
-- (completed model calls), tokens and cost from its spend events, and a failure's whole cause
-- (eventos.failures: bounded, redacted).
CREATE FUNCTION timeline_turn_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    SELECT NEW.employee, 'turn.' || NEW.status, NEW.thread, coalesce(NEW.chains, '{}'), NEW.id,
           jsonb_build_object('n', NEW.n, 'class', NEW.class, 'agent', NEW.agent,
                              'steps', s.steps, 'tokens', s.tokens, 'usd', s.usd,
                              'seconds', round(extract(epoch FROM clock_timestamp()
                                                                   - NEW.started_at), 3),
                              'error', left(NEW.error, 500))
    FROM (SELECT count(*) FILTER (WHERE state = 'settled'
                                    AND coalesce(input_tokens, 0) + coalesce(output_tokens, 0) > 0)
                     AS steps,
                 coalesce(sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)), 0) AS tokens,
                 coalesce(sum(actual_usd) FILTER (WHERE state = 'settled'), 0) AS usd
          FROM spend_events WHERE turn_id = NEW.id) s;
    RETURN NULL;
END
$$;
CREATE TRIGGER turns_timeline_ended AFTER UPDATE OF status ON turns
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION timeline_turn_ended();

-- An outbox row: queued (a reply, or an owner's Retry), held, sent, failed, unknown, expired.
-- Its thread and chains are its turn's.
CREATE FUNCTION timeline_outbound() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    SELECT NEW.employee, 'reply.' || NEW.status, coalesce(t.thread, NEW.thread),
           coalesce(t.chains, '{}'), NEW.id::text,
           jsonb_build_object('channel', NEW.kind, 'turn', NEW.turn_id,
                              'held_reason', NEW.held_reason, 'attempts', NEW.attempts,
                              'retry', NEW.retry_requested_at IS NOT NULL)
    FROM (SELECT 1) one LEFT JOIN turns t ON t.id = NEW.turn_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER outbound_messages_timeline_added AFTER INSERT ON outbound_messages
    FOR EACH ROW EXECUTE FUNCTION timeline_outbound();
CREATE TRIGGER outbound_messages_timeline_moved AFTER UPDATE OF status ON outbound_messages
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status <> 'sending')
    EXECUTE FUNCTION timeline_outbound();

-- Alarms (and task deadlines): set, fired (each occurrence of a repeat), missed, cancelled.
CREATE FUNCTION timeline_alarm() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    what text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        what := 'alarm.set';
    ELSIF NEW.status IN ('missed', 'cancelled') THEN
        what := 'alarm.' || NEW.status;
    ELSIF NEW.fired_at IS DISTINCT FROM OLD.fired_at THEN
        what := 'alarm.fired';
    ELSE
        what := 'alarm.missed';
    END IF;
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    VALUES (NEW.employee, what, NEW.thread, ARRAY[NEW.chain_id], NEW.id,
            jsonb_build_object('alarm_kind', NEW.kind, 'due_at', NEW.due_at,
                               'occurrence', NEW.occurrence));
    RETURN NULL;
END
$$;
CREATE TRIGGER alarms_timeline_added AFTER INSERT ON alarms
    FOR EACH ROW EXECUTE FUNCTION timeline_alarm();
CREATE TRIGGER alarms_timeline_moved AFTER UPDATE OF status, occurrence ON alarms
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       OR OLD.occurrence IS DISTINCT FROM NEW.occurrence)
    EXECUTE FUNCTION timeline_alarm();

-- Delegated tasks, on the delegator's timeline (the assignee sees the task arrive as an input).
CREATE FUNCTION timeline_task() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    VALUES (NEW.from_employee,
            CASE WHEN TG_OP = 'INSERT' THEN 'task.delegated' ELSE 'task.' || NEW.status END,
            NEW.reply_to ->> 'thread', ARRAY[NEW.chain_id], NEW.id,
            jsonb_build_object('to', NEW.to_employee, 'deadline_at', NEW.deadline_at));
    RETURN NULL;
END
$$;
CREATE TRIGGER ipc_tasks_timeline_added AFTER INSERT ON ipc_tasks
    FOR EACH ROW EXECUTE FUNCTION timeline_task();
CREATE TRIGGER ipc_tasks_timeline_moved AFTER UPDATE OF status ON ipc_tasks
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION timeline_task();

-- A tool call that finished (done, or `unknown`), with its outcome's code.
CREATE FUNCTION timeline_tool_call() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    SELECT NEW.employee, 'tool.' || NEW.status, NEW.thread, coalesce(t.chains, '{}'), NEW.id,
           jsonb_build_object('tool', NEW.name, 'effect', NEW.effect, 'outcome', NEW.outcome,
                              'turn', NEW.turn_id)
    FROM (SELECT 1) one LEFT JOIN turns t ON t.id = NEW.turn_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER tool_calls_timeline_added AFTER INSERT ON tool_calls
    FOR EACH ROW WHEN (NEW.status <> 'calling') EXECUTE FUNCTION timeline_tool_call();
CREATE TRIGGER tool_calls_timeline_moved AFTER UPDATE OF status ON tool_calls
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status <> 'calling')
    EXECUTE FUNCTION timeline_tool_call();

-- An attention item raised (its first raise; repeats count on the item). About a turn (`ref`
-- its id) or a stream (`<stream_key>#…`), it takes that thread (and the turn's chains).
CREATE FUNCTION timeline_attention() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, kind, thread, chains, ref, detail)
    SELECT NEW.employee, 'attention.raised',
           coalesce(t.thread, CASE WHEN NEW.ref LIKE '%/%/%/%#%'
                                   THEN split_part(split_part(NEW.ref, '#', 1), '/', 4) END),
           coalesce(t.chains, '{}'), NEW.id::text,
           jsonb_build_object('attention', NEW.kind, 'severity', NEW.severity)
    FROM (SELECT 1) one LEFT JOIN turns t ON t.id = NEW.ref;
    RETURN NULL;
END
$$;
CREATE TRIGGER attention_items_timeline AFTER INSERT ON attention_items
    FOR EACH ROW EXECUTE FUNCTION timeline_attention();

-- The web console's reads (issue 16); see 0023_console.sql.
CREATE INDEX turns_employee_started ON turns (employee, started_at DESC, id DESC);
CREATE INDEX tool_calls_turn ON tool_calls (turn_id);
CREATE INDEX chat_messages_session ON chat_messages (employee, audience, session, id);
CREATE INDEX chat_events_turn ON chat_events (turn_id);

-- The operator event stream (issue 16 point 5; docs/events.md) and the chat stream's places.
--
-- An event row is written beside the state change it tells, in the same transaction, without
-- a place in the stream (`pos` NULL). One sequencer (eventos.event_positions), under an
-- advisory lock, gives committed rows their places from `event_positions` in a transaction of
-- its own; readers read `pos > last`. A row still uncommitted is invisible to the sequencer, so
-- it takes a place after every place given before it commits: a reader that resumed past
-- later events still gets it, once. Ids alone (`id > last`) would skip it: an identity value
-- is taken at insert, and rows commit out of that order.
CREATE SEQUENCE event_positions;

CREATE TABLE operator_events (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pos       bigint UNIQUE,  -- its place in the stream; NULL until the sequencer gives it one
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    employee  text NOT NULL,
    audience  text,  -- the user whose chat it is about (they see it too); NULL: the admin's
    kind      text NOT NULL,  -- `<family>.<what>`: turn.done, outbox.sent, attention.acked, …
    ref       text NOT NULL,  -- the id of what changed (turn, outbox row, item, approval, …)
    state     text,
    detail    jsonb NOT NULL DEFAULT '{}'  -- ids, codes and counts; never message text
);
-- The sequencer's work: rows without a place, oldest first.
CREATE INDEX operator_events_unplaced ON operator_events (id) WHERE pos IS NULL;
-- The retention sweep (7 days), oldest first.
CREATE INDEX operator_events_age ON operator_events USING brin (at);

-- Every place at or below `through` may be gone (7 days' retention): a reader resuming from
-- below it is told so (410) instead of missing what went.
CREATE TABLE operator_events_pruned (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    through  bigint NOT NULL DEFAULT 0
);
INSERT INTO operator_events_pruned DEFAULT VALUES;

-- Chat events take places from the same sequencer; the stream reads by place (was: by id,
-- which skipped a reply committed after a later run event).
ALTER TABLE chat_events ADD COLUMN pos bigint UNIQUE;
UPDATE chat_events c SET pos = p.pos
FROM (SELECT id, nextval('event_positions') AS pos FROM (SELECT id FROM chat_events ORDER BY id) q) p
WHERE c.id = p.id;
DROP INDEX chat_events_session;
CREATE INDEX chat_events_session ON chat_events (employee, audience, session, pos);
CREATE INDEX chat_events_unplaced ON chat_events (id) WHERE pos IS NULL;

-- A committed event wakes the sequencer (a hint: it also looks every few seconds).
CREATE FUNCTION operator_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('eventos_operator_events', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER operator_events_notify AFTER INSERT ON operator_events
    FOR EACH STATEMENT EXECUTE FUNCTION operator_events_notify();

-- Turns, outbox rows, dead deliveries and raised attention items: told by the timeline's
-- entries (written by its triggers, 0022), so no second trigger sits on turns, the outbox or
-- bus_deliveries. The WHEN clause keeps the router's and the relay's entries (accepted,
-- routed, delivered) out of the function; a user's chat thread makes the event theirs too.
CREATE FUNCTION operator_event_from_timeline() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    family text := split_part(NEW.kind, '.', 1);
    what text := split_part(NEW.kind, '.', 2);
    -- The outbox row's or the item's id; never a cast that could fail the writer's statement.
    row_id bigint := CASE WHEN NEW.ref ~ '^[0-9]{1,18}$' THEN NEW.ref::bigint END;
BEGIN
    INSERT INTO operator_events (employee, audience, kind, ref, state, detail)
    SELECT NEW.employee,
           CASE family
               WHEN 'reply' THEN (SELECT o.audience FROM outbound_messages o WHERE o.id = row_id)
               WHEN 'attention' THEN (SELECT a.audience FROM attention_items a
                                      WHERE a.id = row_id)
               ELSE (SELECT u.name FROM users u WHERE u.thread = NEW.thread)
           END,
           CASE family WHEN 'reply' THEN 'outbox.' || what
                       WHEN 'input' THEN 'dead_letter.added' ELSE NEW.kind END,
           CASE family WHEN 'input' THEN 'delivery-' || NEW.ref ELSE NEW.ref END,
           CASE family WHEN 'attention' THEN 'open' WHEN 'input' THEN 'dead' ELSE what END,
           NEW.detail;
    RETURN NULL;
END
$$;
CREATE TRIGGER employee_timeline_operator_events AFTER INSERT ON employee_timeline
    FOR EACH ROW WHEN (NEW.kind LIKE 'turn.%' OR NEW.kind LIKE 'reply.%'
                       OR NEW.kind IN ('input.dead', 'attention.raised'))
    EXECUTE FUNCTION operator_event_from_timeline();

-- An attention item acknowledged or resolved (raised: from the timeline above).
CREATE FUNCTION operator_event_attention() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operator_events (employee, audience, kind, ref, state, detail)
    VALUES (NEW.employee, NEW.audience, 'attention.' || NEW.state, NEW.id::text, NEW.state,
            jsonb_build_object('attention', NEW.kind, 'severity', NEW.severity,
                               'by', CASE NEW.state WHEN 'acked' THEN NEW.acked_by
                                                    ELSE NEW.resolved_by END));
    RETURN NULL;
END
$$;
CREATE TRIGGER attention_items_operator_events AFTER UPDATE OF state ON attention_items
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION operator_event_attention();

-- An approval created, decided (approved, declined) or expired; never its draft.
CREATE FUNCTION operator_event_approval() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operator_events (employee, audience, kind, ref, state, detail)
    VALUES (NEW.employee, NEW.audience,
            CASE WHEN TG_OP = 'INSERT' THEN 'approval.created'
                 WHEN NEW.state = 'expired' THEN 'approval.expired'
                 ELSE 'approval.decided' END,
            NEW.id, NEW.state,
            jsonb_build_object('approval_kind', NEW.kind, 'generation', NEW.generation,
                               'outbound', NEW.outbound_id, 'expires_at', NEW.expires_at,
                               'by', NEW.decided_by));
    RETURN NULL;
END
$$;
CREATE TRIGGER approvals_operator_events_added AFTER INSERT ON approvals
    FOR EACH ROW EXECUTE FUNCTION operator_event_approval();
CREATE TRIGGER approvals_operator_events_moved AFTER UPDATE OF state ON approvals
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION operator_event_approval();

-- A generation's state: starting, running, paused (with its reason), retired.
CREATE FUNCTION operator_event_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operator_events (employee, kind, ref, state, detail)
    VALUES (NEW.employee, 'employee.' || NEW.state, NEW.generation::text, NEW.state,
            jsonb_build_object('generation', NEW.generation, 'pause_reason', NEW.pause_reason));
    RETURN NULL;
END
$$;
CREATE TRIGGER generations_operator_events_added AFTER INSERT ON generations
    FOR EACH ROW EXECUTE FUNCTION operator_event_generation();
CREATE TRIGGER generations_operator_events_moved AFTER UPDATE OF state ON generations
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION operator_event_generation();

-- An employee became degraded, or recovered (by itself or by the owner's clear).
CREATE FUNCTION operator_event_health() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operator_events (employee, kind, ref, state, detail)
    VALUES (NEW.employee,
            CASE WHEN NEW.degraded_since IS NULL THEN 'employee.recovered'
                 ELSE 'employee.degraded' END,
            NEW.employee,
            CASE WHEN NEW.degraded_since IS NULL THEN 'recovered' ELSE 'degraded' END,
            jsonb_build_object('reason', NEW.reason,
                               'by', CASE WHEN NEW.degraded_since IS NULL THEN NEW.cleared_by END));
    RETURN NULL;
END
$$;
CREATE TRIGGER employee_health_operator_events_added AFTER INSERT ON employee_health
    FOR EACH ROW WHEN (NEW.degraded_since IS NOT NULL)
    EXECUTE FUNCTION operator_event_health();
CREATE TRIGGER employee_health_operator_events_moved AFTER UPDATE OF degraded_since
    ON employee_health
    FOR EACH ROW WHEN ((OLD.degraded_since IS NULL) <> (NEW.degraded_since IS NULL))
    EXECUTE FUNCTION operator_event_health();

-- Fault run (issue 17): the ask that granted a turn; see 0025_turn_asks.sql.
ALTER TABLE turns ADD COLUMN ask text;
CREATE INDEX turns_ask ON turns (ask) WHERE ask IS NOT NULL;

-- Retention (SPEC §15): dead ingress rows kept 90 days, the delivery sweep; see 0026_retention.sql.
CREATE TABLE bus_ingress_kept PARTITION OF bus_ingress DEFAULT;
ALTER TABLE bus_ingress_kept ADD CONSTRAINT bus_ingress_kept_dead CHECK (status = 'dead');
-- The body sweep keeps a body while a dead ingress row refers to it (replayable).
CREATE INDEX bus_ingress_dead_body_ref ON bus_ingress (body_ref)
    WHERE status = 'dead' AND body_ref IS NOT NULL;
-- The delivery sweep: finished deliveries past 30 days, oldest first (dead ones, past 90
-- days, through bus_deliveries_dead).
CREATE INDEX bus_deliveries_finished ON bus_deliveries (updated_at)
    WHERE status IN ('done', 'failed');

-- Users are the owner's guests: their own id, class and daily cap; see 0027_user_guests.sql.
ALTER TABLE users ADD COLUMN id uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE;
ALTER TABLE users ADD COLUMN class smallint NOT NULL DEFAULT 2 CHECK (class IN (1, 2));
ALTER TABLE users ADD COLUMN daily_usd numeric(12, 4) CHECK (daily_usd > 0);
CREATE INDEX spend_events_period ON spend_events (employee, period_start);
CREATE INDEX outbound_messages_turn ON outbound_messages (turn_id);
-- A chat message's user record (NULL: the admin's, or a user's from before records had ids): a
-- re-created name's client ids never meet the old holder's.
ALTER TABLE chat_messages ADD COLUMN user_id uuid;
ALTER TABLE chat_messages DROP CONSTRAINT chat_messages_client_id;
CREATE UNIQUE INDEX chat_messages_client_id ON chat_messages (employee, audience, session,
    client_message_id, coalesce(user_id, '00000000-0000-0000-0000-000000000000'::uuid));

-- SPEC §15 staleness: expired deliveries and tasks; see 0030_expiry.sql.
ALTER TABLE bus_deliveries DROP CONSTRAINT bus_deliveries_status_check;
ALTER TABLE bus_deliveries ADD CONSTRAINT bus_deliveries_status_check
    CHECK (status IN ('pending', 'held', 'delivered', 'done', 'failed', 'dead', 'expired'));
ALTER TABLE ipc_tasks DROP CONSTRAINT ipc_tasks_status_check;
ALTER TABLE ipc_tasks ADD CONSTRAINT ipc_tasks_status_check
    CHECK (status IN ('open', 'done', 'timed_out', 'cancelled', 'expired'));
DROP INDEX bus_deliveries_finished;
CREATE INDEX bus_deliveries_finished ON bus_deliveries (updated_at)
    WHERE status IN ('done', 'failed', 'expired');
-- The staleness sweep: messages and tasks between employees not yet handed to their entity.
CREATE INDEX bus_deliveries_ipc_waiting ON bus_deliveries (ingress_received_at)
    WHERE status IN ('pending', 'held') AND type IN ('eventos.ipc.message', 'eventos.ipc.task');

CREATE OR REPLACE FUNCTION timeline_deliveries_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO employee_timeline (employee, at, kind, thread, chains, ref, detail)
    SELECT split_part(n.stream_key, '/', 1), clock_timestamp(),
           CASE n.status WHEN 'delivered' THEN 'input.delivered' WHEN 'dead' THEN 'input.dead'
                         WHEN 'pending' THEN 'input.pending' WHEN 'expired' THEN 'input.expired'
                         ELSE 'input.skipped' END,
           n.thread, ARRAY[n.chain_id], n.id::text,
           jsonb_build_object('seq', n.seq, 'class', n.class, 'attempts', n.attempts,
                              'reason', left(split_part(n.reason, ':', 1), 80))
    FROM moved_to n JOIN moved_from o ON o.id = n.id
    WHERE o.status IS DISTINCT FROM n.status
      AND (n.status IN ('delivered', 'dead', 'pending', 'expired')
           OR (n.status = 'done' AND n.reason LIKE 'skipped:%'));
    RETURN NULL;
END
$$;

-- The console navigation's count of outbox rows whose fate is unknown (migration 0031).
CREATE INDEX outbound_messages_unknown ON outbound_messages (id) WHERE status = 'unknown';

-- A dead letter keeps the turn that failed twice (the console links it; migration 0032).
ALTER TABLE bus_deliveries ADD COLUMN turn_id text;
