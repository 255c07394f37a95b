"""Names shared across services: queues, classes, lanes, statuses, service names.

Services use these by name and never import each other's code.
"""

from __future__ import annotations

import hashlib
from typing import Final

SERVICES: Final = ("ingress", "router", "relay", "workers-workflow", "workers-llm", "egress")

# Scheduling classes (SPEC §9); the value is also the Temporal priority key.
C1_OWNER: Final = 1
C2_CUSTOMER: Final = 2
C3_INTERNAL: Final = 3
C4_BACKGROUND: Final = 4
CLASSES: Final = (C1_OWNER, C2_CUSTOMER, C3_INTERNAL, C4_BACKGROUND)

# Temporal task queues.
WORKFLOW_QUEUE: Final = "workflows"
EGRESS_QUEUE: Final = "egress"
# The owner's conversations (and their turns) run on a workflow queue of their own beside each
# workflow queue, polled by the same workers-workflow processes with workflow task slots of its
# own: no background workflow task stands between the owner's message and its reply (issue 27).
OWNER_QUEUE_SUFFIX: Final = ".owner"
# The other conversations' turns run on one of their own beside each workflow queue, with
# slots of its own too: admission bounds the turns, not the conversations, so a turn once
# admitted never waits behind a burst's many conversations starting (issue 27).
TURN_QUEUE_SUFFIX: Final = ".turns"
# Reserved floors of the classes (SPEC §9): shares of admitted turns and, while Temporal
# pushes back, of the relay's Signal rate.
CLASS_FLOORS: Final = {C1_OWNER: 0.30, C2_CUSTOMER: 0.40, C3_INTERNAL: 0.15, C4_BACKGROUND: 0.15}
LLM_QUEUES: Final = {c: f"llm-c{c}" for c in CLASSES}

# Lanes and threads (SPEC §3).
LANE_TALK: Final = "talk"
LANE_CUSTOMER: Final = "customer"
LANE_WORKER: Final = "worker"
THREAD_MAIN: Final = "main"
# Trigger kinds of customer channels (the customer lane).
CHANNEL_KINDS: Final = ("telegram", "whatsapp_business", "discord", "email")
# A customer's message read this long after it was sent carries a lateness note (SPEC §15).
CUSTOMER_LATE_NOTE_AFTER_S: Final = 60.0
# A channel driver marks a group conversation with this CloudEvents extension attribute.
GROUP_ATTRIBUTE: Final = "chatkind"
GROUP_CHAT: Final = "group"

# Generation states.
GEN_STARTING: Final = "starting"
GEN_RUNNING: Final = "running"
GEN_PAUSED: Final = "paused"
GEN_RETIRED: Final = "retired"
ROUTABLE_GENERATION_STATES: Final = (GEN_STARTING, GEN_RUNNING, GEN_PAUSED)

# Stream hold reasons.
HOLD_STARTING: Final = "starting"
HOLD_PAUSED: Final = "paused"

# Ingress row statuses (SPEC §5).
INGRESS_ACCEPTED: Final = "accepted"
INGRESS_ROUTED: Final = "routed"
INGRESS_NO_CONSUMER: Final = "no_consumer"
INGRESS_DEAD: Final = "dead"

# Event types produced by ingress.
TYPE_CHAT_MESSAGE: Final = "eventos.chat.message"
TYPE_WEBHOOK: Final = "eventos.webhook.received"

# Bounds (SPEC §6, §7, §15).
ENVELOPE_MAX_BYTES: Final = 64 * 1024
PREVIEW_BYTES: Final = 4 * 1024
DEFAULT_MAX_BODY: Final = 256 * 1024
MAX_BODY_LIMIT: Final = 10 * 1024 * 1024
FANOUT_MAX: Final = 50
OWNER_CHAT_PENDING_MAX: Final = 100  # per session for the admin; per user, all its sessions
# A user is the owner's guest (SPEC §17): its daily spend cap, per employee, is this share of the
# employee's daily budget unless the admin set one (`POST /v1/users` `daily_usd`).
USER_DAILY_SHARE: Final = 0.25
CHAT_RETRY_AFTER_S: Final = 5  # a chat refused for its pending bound: try again after this
PUBLISH_IN_FLIGHT_MAX: Final = 1000
DEDUPE_TTL_DAYS: Final = 7
BODY_HASH_DEDUPE_SECONDS: Final = 600
INGRESS_RETENTION_DAYS: Final = 7
DEAD_LETTER_RETENTION_DAYS: Final = 90  # a body a dead letter refers to stays replayable
DELIVERY_RETENTION_DAYS: Final = 30  # finished deliveries (SPEC §15)
# Dedupe keys longer than this (UTF-8 bytes) are stored as LONG_KEY_PREFIX + their sha256, so
# no provider key (a WhatsApp batch of 60 statuses makes 4.6 KB) can overflow the index.
DEDUPE_KEY_MAX_BYTES: Final = 512
LONG_KEY_PREFIX: Final = "key-sha256:"
# JSON bodies and envelopes nested deeper than this are malformed (SPEC §6.1).
JSON_MAX_DEPTH: Final = 64
# Records waiting for a group-commit transaction per ingress process; beyond it, 503.
COMMIT_QUEUE_MAX: Final = 4096

# Source keys: "<kind>:<scope>" (SPEC §5 source_key).
SOURCE_WEBHOOK: Final = "webhook"
SOURCE_CHAT: Final = "chat"
KIND_CHAT: Final = "chat"  # owner chat, as a route and an outbox row kind
# The chat session a message belongs to when it names none (also where notices go).
DEFAULT_SESSION: Final = "owner"
SOURCE_GRPC: Final = "grpc"
# Internal producers (alarms, employee messaging, tools, the platform itself). No spec trigger
# declares these kinds; over gRPC only the internal credential may publish them (SPEC §6.3).
SOURCE_INTERNAL: Final = "internal"
SOURCE_ALARM: Final = "alarm"
SOURCE_IPC: Final = "ipc"
SOURCE_TOOL: Final = "tool"
SOURCE_CRON: Final = "cron"  # a cron trigger's ticks: `cron:<employee>/<trigger>`
INTERNAL_SOURCE_KINDS: Final = (SOURCE_INTERNAL, SOURCE_ALARM, SOURCE_IPC, SOURCE_TOOL)
# Sources the HTTP edge owns: never publishable over gRPC, by anyone.
HTTP_EDGE_SOURCE_KINDS: Final = (SOURCE_WEBHOOK, SOURCE_CHAT)
# A grpc trigger without `token:` names the secret `driver-<driver id>`.
DRIVER_TOKEN_REF_PREFIX: Final = "driver-"
# Bounds of a DriverEvent's string fields (UTF-8 bytes). Dedupe keys may be longer: the bus
# stores keys past DEDUPE_KEY_MAX_BYTES as their sha256.
DRIVER_FIELD_MAX_BYTES: Final = 256
DRIVER_DEDUPE_KEY_MAX_BYTES: Final = 8192


def source_key(kind: str, scope: str) -> str:
    """The source key of a trigger kind and its scope (path, employee, driver id)."""
    return f"{kind}:{scope}"


def source_kind(source: str) -> str:
    """The kind of a source key (`webhook` of `webhook:stripe`)."""
    return source.split(":", 1)[0]


def driver_token_ref(driver: str) -> str:
    """The default secret reference of a driver's token."""
    return DRIVER_TOKEN_REF_PREFIX + driver


def stream_key(employee: str, generation: int, lane: str, thread: str) -> str:
    """The key of the stream `(employee, generation, lane, thread)`."""
    return f"{employee}/g{generation}/{lane}/{thread}"


def lane_of(stream: str) -> str:
    """The lane of a stream key (employee names and lanes hold no `/`)."""
    return stream.split("/")[2]


# Temporal workflow, signal and query names (used by name across services).
WF_CONVERSATION: Final = "ConversationWorkflow"
SIGNAL_DELIVER: Final = "deliver"
QUERY_STATUS: Final = "status"

# Relay bounds (SPEC §7, §8 step 3).
BATCH_MAX_ITEMS: Final = 16
BATCH_MAX_BYTES: Final = 256 * 1024
WINDOW_MAX_INPUTS: Final = 32
WINDOW_MAX_BYTES: Final = 512 * 1024
HOLD_WINDOW: Final = "window"
DEAD_AFTER_ATTEMPTS: Final = 5
# Priority key of an entity start by lane (SPEC §9: owner 1, customers 2, internal work 3).
LANE_PRIORITY: Final = {LANE_TALK: 1, LANE_CUSTOMER: 2, LANE_WORKER: 3}

# Activity names (used by name across services).
ACT_LLM_STEP: Final = "llm_step"
WF_TURN: Final = "TurnWorkflow"
SIGNAL_OFFER: Final = "offer_inputs"
SIGNAL_WAKE: Final = "wake"
SIGNAL_INPUTS_CONSUMED: Final = "inputs_consumed"
SIGNAL_STOP_AT_MERGE: Final = "stop_at_merge_point"
UPDATE_INTERRUPT: Final = "interrupt_turn"
ACT_ADMIT: Final = "admit_turn"
ACT_RELEASE: Final = "release_turn"
ACT_LOAD: Final = "load_conversation"
ACT_SAVE: Final = "save_turn"
ACT_SEND: Final = "egress_send"
ACT_RUN_EVENT: Final = "record_run_event"
ACT_TERMINATE: Final = "terminate_workflow"
ACT_RUN_ENDED: Final = "entity_run_ended"  # the run's Signals and history size, for metrics
ACT_SUSPEND: Final = "suspend_turn"
ACT_UPGRADE_LEASE: Final = "upgrade_lease"
SIGNAL_RELEASED: Final = "released"

# Turns (SPEC §7, §8, I7).
TURN_MAX_INPUTS: Final = 50
TURN_MAX_BYTES: Final = 256 * 1024
TURN_MAX_STEPS: Final = 16
TURN_MAX_B2: Final = 2  # merge point B2 at most twice per turn, customer channels only
TURN_CANCEL_GRACE_S: Final = 120.0  # a cancelled turn closes within this, else is terminated
LLM_HEARTBEAT_S: Final = 60.0  # a model step unheard from this long is retried (TurnTimeouts)
TRANSCRIPT_MAX_BYTES: Final = 393_216
EMPLOYEE_TURN_CAP: Final = 4  # plus one slot reserved for the owner (C1)

# Budgets (SPEC §9): ledger states; admission's budget gate.
BUDGET_NORMAL: Final = "normal"
BUDGET_HIGH: Final = "high"  # ≥ 80% spent or reserved: C3/C4 held
BUDGET_MAX: Final = "max"  # a reservation would pass 100%: the employee pauses
BUDGET_HIGH_SHARE: Final = 0.8
GATE_BUDGET: Final = "budget"
GATE_PARKED_TOO_LONG: Final = "parked_too_long"  # a turn parked 7 days: its inputs are dead
PARK_MAX_S: Final = 7 * 24 * 3600.0
ADMISSION_ASK_AGAIN_S: Final = 30.0  # a waiting entity asks again this often (wakes are hints)
PAUSE_BUDGET: Final = "budget"
PAUSE_OWNER: Final = "owner"
ATTENTION_BUDGET_HIGH: Final = "budget_high"
ATTENTION_BUDGET_MAX: Final = "budget_max"
ATTENTION_SLOW_TURN: Final = "slow_turn"
ATTENTION_PARKED_TURN: Final = "parked_turn"
PARKED: Final = "parked"  # a suspension's reason is `parked: <why>` (SPEC §9 parking)
PROVIDER_OUTAGE: Final = "ProviderOutage"
# The model's endpoint or credential is not on the operator's list (EVENTOS_LLM_ENDPOINTS).
LLM_ENDPOINT_NOT_ALLOWED: Final = "LlmEndpointNotAllowed"


def queue_for(base: str, workflow_queue: str) -> str:
    """An activity queue next to a workflow queue: the plain name on the instance's own
    queue, else namespaced by it (so tests sharing one Temporal server never cross); the owner's
    workflow queue and the turns' share their home queue's activity queues."""
    home = workflow_queue.removesuffix(OWNER_QUEUE_SUFFIX).removesuffix(TURN_QUEUE_SUFFIX)
    return base if home == WORKFLOW_QUEUE else f"{home}.{base}"


def owner_queue(workflow_queue: str) -> str:
    """The workflow queue of the owner's conversations beside `workflow_queue`."""
    return workflow_queue + OWNER_QUEUE_SUFFIX


def turn_queue(workflow_queue: str) -> str:
    """The workflow queue of the other conversations' turns beside `workflow_queue`."""
    return workflow_queue + TURN_QUEUE_SUFFIX


def owners_conversation(stream_key: str, thread: str) -> bool:
    """The owner's own conversation: the owner chat (lane talk), not a user's (SPEC §17)."""
    return lane_of(stream_key) == LANE_TALK and not thread.startswith(USER_THREAD_PREFIX)


ACT_DEAD_LETTER: Final = "dead_letter_inputs"
TURN_ATTEMPTS: Final = 2  # a failed turn's inputs are retried once (SPEC §8)
ATTENTION_DEAD_INPUT: Final = "dead_input"
ATTENTION_RECIPIENT_UNREADABLE: Final = "recipient_unreadable"  # its outbox row failed unsent
ACT_LOAD_INPUTS: Final = "load_inputs"
# How a turn ended (`turns.status`, TurnResult, ReleaseTurn).
TURN_DONE: Final = "done"
TURN_FAILED: Final = "failed"
TURN_CANCELLED: Final = "cancelled"
TURN_INTERRUPTED: Final = "interrupted"
# Run events on the owner's chat event stream (SPEC §6.2), besides `reply`.
RUN_START: Final = "run.start"
RUN_INPUT_MERGED: Final = "run.input_merged"
RUN_REPLY: Final = "reply"
RUN_NOTICE: Final = "notice"  # a notice in the chat (the budget paused it, a reply is held)
ENTITY_ROLL_AFTER: Final = 4000  # continue-as-new past this many events or Signals (SPEC §7)

# Supervision (SPEC §7, I2): owner intents, the supervisor, start-once and cron.
WF_SUPERVISOR: Final = "EmployeeSupervisorWorkflow"
WF_SCHEDULE_FIRE: Final = "ScheduleFireWorkflow"
UPDATE_SET_CONTROL: Final = "set_control_state"
UPDATE_SET_LIMITS: Final = "set_limits"
ACT_CONVERGE: Final = "converge_supervisor"
ACT_APPLY_CONTROL: Final = "apply_control"
ACT_FIRE_SCHEDULE: Final = "fire_schedule"
ACT_BUDGET_REFRESH: Final = "budget_refresh"
SIGNAL_BUDGET_CHANGED: Final = "budget_changed"
ACT_SKIP_INPUTS: Final = "skip_inputs"
ACT_TOOL_FAILED: Final = "record_tool_failed"
ON_BUSY_SKIP: Final = "skip"
ON_BUSY_MERGE: Final = "merge"
# Intent kinds and states (the API and `eventosctl get` show the state).
INTENT_START: Final = "start"
INTENT_STOP: Final = "stop"
INTENT_RESUME: Final = "resume"
INTENT_RESET: Final = "reset"
INTENT_INTERRUPT: Final = "interrupt"
INTENT_LIMITS: Final = "limits"
INTENT_REARM: Final = "rearm"
INTENT_APPROVAL: Final = "approval"  # an approval's decision: nudge its workflow
INTENT_APPLYING: Final = "applying"
INTENT_APPLIED: Final = "applied"
INTENT_FAILED: Final = "failed"
# Priority keys of top-level starts (SPEC §7, §9): the supervisor 1; cron, polls and start 4.
SUPERVISOR_PRIORITY: Final = 1
TRIGGER_PRIORITY: Final = 4
SUPERVISOR_ROLL_UPDATES: Final = 1800  # continue-as-new at this many Updates
SUPERVISOR_REBUILDS_PER_HOUR: Final = 3  # then an attention item asks for Reset
ATTENTION_SUPERVISOR_LOST: Final = "supervisor_lost"
ATTENTION_SCHEDULE_REFUSED: Final = "schedule_refused"  # Temporal refused a cron Schedule
ATTENTION_INTENT_FAILED: Final = "intent_failed"  # an intent settled failed, with its cause
INTENT_ATTEMPTS_MAX: Final = 12  # attempts that got an error answer (not silence), then failed
TYPE_TRIGGER_START: Final = "eventos.trigger.start"
TYPE_TRIGGER_CRON: Final = "eventos.trigger.cron"


def supervisor_id(employee: str, generation: int) -> str:
    """The supervisor's workflow id, `emp-<employee>-g<gen>`."""
    return f"emp-{employee}-g{generation}"


def schedule_id(employee: str, generation: int, trigger: str) -> str:
    """A cron trigger's Schedule id, `cron-<employee>-g<gen>-<trigger>` (immutable ids)."""
    return f"cron-{employee}-g{generation}-{trigger}"


# Tools (SPEC §10, §11). One activity type runs every tool call, on the workflow queue.
ACT_TOOL: Final = "tool_call"
TOOL_OK: Final = "ok"
TOOL_REFUSED: Final = "refused"  # the model can fix it (bad arguments, a limit, a refusal)
TOOL_UNKNOWN: Final = "unknown"  # an unsafe call broke off: it may or may not have happened
TOOL_FAILED: Final = "failed"  # configuration or a broken tool: not the model's doing
# tool_calls.status: a call is `calling` from just before it may reach the outside world.
TOOL_CALLING: Final = "calling"
TOOL_DONE: Final = "done"
TOOL_RESULT_MAX_BYTES: Final = 16 * 1024  # what a tool result may put into the transcript
TOOL_ARGUMENTS_MAX_BYTES: Final = 32 * 1024  # a call's input stays under the 64 KB bound (I7)
ATTENTION_TOOL_UNKNOWN: Final = "tool_unknown"
# Why a tool call failed, as the model reads it: a short fixed reason per error type, never a
# database's or an exception's text (it may quote rows, parameters or credentials). The
# activity raises these types; any other failure reads as TOOL_REASON_INTERNAL.
RECORD_REFUSED: Final = "RecordRefused"  # a database activity's record, refused (bounded)
TOOL_ERROR_DATA: Final = "ToolDataRefused"
TOOL_ERROR_DATABASE: Final = "ToolDatabaseUnavailable"
TOOL_ERROR_INTERNAL: Final = "ToolInternalError"
TOOL_REASON_DATA: Final = "the database refused the call's data"
TOOL_REASON_DATABASE: Final = "the database was unavailable"
TOOL_REASON_INTERNAL: Final = "an internal error"
TOOL_REASON_TIMEOUT: Final = "the call timed out"
TOOL_REASONS: Final = {
    TOOL_ERROR_DATA: TOOL_REASON_DATA, TOOL_ERROR_DATABASE: TOOL_REASON_DATABASE,
    TOOL_ERROR_INTERNAL: TOOL_REASON_INTERNAL,
}  # fmt: skip
ACTION_RETRY: Final = "retry"  # an attention item's action: run the call once more
# Internal events placed in a named stream: the producer names lane, thread and reply route
# (CloudEvents extension attributes; only internal producers write these sources).
ATTR_LANE: Final = "eventoslane"
ATTR_THREAD: Final = "eventosthread"
ATTR_ROUTE: Final = "eventosroute"
ATTR_PATH: Final = "eventospath"  # the employees an internal wake went through (I8)
THREAD_BY_EXPLICIT: Final = "explicit"  # an implicit subscription's placement
PEER_THREAD_PREFIX: Final = "peer_"
USER_THREAD_PREFIX: Final = "u_"  # a user's owner chat: `u_` and 16 hex of its record's id
PEER_ORIGIN_HEX: Final = 12  # hex digits of the origin conversation in a peer thread's name
STORM_PATH_MAX: Final = 16  # employees an internal wake's path keeps (SPEC §10)
TYPE_TOOL_RETRY: Final = "eventos.tool.retry"  # the owner asked to run an unknown call again


def peer_thread(sender: str, lane: str, thread: str) -> str:
    """The thread of the target where wakes from `sender`'s conversation (lane, thread) land:
    `peer_<sender>_<hash>`. One per origin conversation, so the target's history for one of
    the sender's customers never holds another's (EG17); the hash carries no personal data
    (a customer's thread id is itself a hash, the lane a fixed word)."""
    origin = hashlib.sha256(f"{lane}/{thread}".encode()).hexdigest()[:PEER_ORIGIN_HEX]
    return f"{PEER_THREAD_PREFIX}{sender}_{origin}"


# Poll triggers (SPEC §7 PollWorkflow, §15 Polls).
WF_POLL: Final = "PollWorkflow"
ACT_POLL: Final = "poll_once"
SOURCE_POLL: Final = "poll"
TYPE_POLL_ITEM: Final = "eventos.poll.item"
POLL_INTERVAL_MIN_S: Final = 30
POLL_BACKOFF_MAX_S: Final = 3600  # failures double the interval up to an hour
POLL_JITTER_SHARE: Final = 0.10  # jitter ≤ 10% of the interval …
POLL_JITTER_MAX_S: Final = 30.0  # … and ≤ 30 s
POLL_FULL_PAGE_DELAY_S: Final = 2.0  # a full page: the next one comes this soon
POLL_PAGE_MAX_ITEMS: Final = 50
POLL_PAGE_MAX_BYTES: Final = 512 * 1024
POLL_UNROUTED_MAX: Final = 1000  # this many accepted rows of the source: the cycle is skipped
POLL_FAILURES_DRIVER_DOWN: Final = 5  # consecutive failures, then "driver down"
POLL_RESPONSE_MAX_BYTES: Final = 2 * 1024 * 1024
ATTENTION_DRIVER_DOWN: Final = "driver_down"
# Channels and egress (issue 14).
ATTENTION_CHANNEL_DOWN: Final = "channel_down"  # an account not read for over 5 minutes
ATTENTION_CHANNEL_BACKPRESSURE: Final = "channel_backpressure"  # past its backlog bound
ATTENTION_SEND_UNKNOWN: Final = "send_unknown"  # a send that may or may not have left
ATTENTION_SEND_FAILED: Final = "send_failed"  # a send the provider refused for good
# Approvals (SPEC §11).
WF_APPROVAL: Final = "ApprovalWorkflow"
SIGNAL_NUDGE: Final = "nudge"
ACT_APPROVAL_READ: Final = "approval_read"
ACT_APPROVAL_REMIND: Final = "approval_remind"
ACT_APPROVAL_EXPIRE: Final = "approval_expire"
ACT_APPROVAL_TAKE: Final = "approval_take"
ACT_APPROVAL_HOLD_TOOL: Final = "approval_hold_tool"
APPROVAL_PENDING: Final = "pending"
APPROVAL_APPROVED: Final = "approved"
APPROVAL_DECLINED: Final = "declined"
APPROVAL_EXPIRED: Final = "expired"
APPROVAL_HELD: Final = "approval"  # an outbox row's held_reason while it waits for a decision
APPROVAL_EXPIRE_AFTER_H: Final = 72  # an approval's default time to decide
# Who decides a hold (SPEC §17): the admin; `user` hands a user's own chat's holds to it too.
DECIDED_BY_ADMIN: Final = "admin"
DECIDED_BY_USER: Final = "user"
HELD_FOR_REVIEW: Final = "held for review"  # all a user is told of a reply the admin holds
REPLY_HELD: Final = "held_for_review"  # a chat message's `reply_status` while its reply is held
# What else became of a held reply (`reply_status`; docs/timeline.md "What became of a message").
REPLY_DECLINED, REPLY_EXPIRED, REPLY_FAILED = "declined", "expired", "failed"
APPROVAL_RENUDGE_S: Final = 10  # SPEC §11: a decided row not taken after 10 s is nudged again
ATTENTION_APPROVAL_EXPIRING: Final = "approval_expiring"
ATTENTION_APPROVAL_EXPIRED: Final = "approval_expired"
ATTENTION_SEND_HELD: Final = "send_held"  # a send its channel's rules hold (window_closed)
HELD_WINDOW_CLOSED: Final = "window_closed"  # WhatsApp: the customer last wrote over 24 h ago
SEND_WAIT: Final = "SendWait"  # a send's retryable error: a bucket, the high water, a claim
SEND_CLAIM_TTL_S: Final = 30  # a send's attempt and claim, unless TurnTimeouts says
# ApplicationError types of the poll activity: each attempt ends with POLL_NEXT (BENIGN, its
# next_retry_delay the wait); POLL_ENDED (non-retryable) ends the workflow.
POLL_NEXT: Final = "PollNext"
POLL_ENDED: Final = "PollEnded"


def poll_id(employee: str, generation: int, trigger: str) -> str:
    """A poll trigger's PollWorkflow id, `poll-<employee>-g<gen>-<trigger>`."""
    return f"poll-{employee}-g{generation}-{trigger}"


# Watched data (SPEC §10, §15): named stores shared by the instance; each write wakes the
# store's watchers with `data.<store>.changed`, coalesced per (subscription, record).
SOURCE_WATCH: Final = "watch"
DATA_STORE_RE: Final = r"^[a-z][a-z0-9-]{0,39}$"
DATA_KEY_RE: Final = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$"
DATA_VALUE_MAX_BYTES: Final = 64 * 1024  # a value's compact JSON (I7)
DATA_KEYS_PER_STORE: Final = 10_000
DATA_LIST_MAX: Final = 200  # keys one data_list answers; `more` says there are others
WATCH_SUBJECTS_MAX: Final = 200  # pending subjects per subscription before one resync
WATCH_RESYNC_SUBJECT: Final = "*"  # no key matches DATA_KEY_RE's first character
WATCH_DELIVER: Final = "deliver"  # the storm guards' verdict that lets a wake through


def data_changed_type(store: str) -> str:
    """The type of a write's event, `data.<store>.changed`."""
    return f"data.{store}.changed"


def data_resync_type(store: str) -> str:
    """The type of the one input standing for a backlog past WATCH_SUBJECTS_MAX."""
    return f"data.{store}.resync"


# Employee messaging and storm guards (SPEC §10, §15; issue 13). Messages and tasks go to
# source `ipc:<target>`, placed in thread `peer_<sender>_<origin>` (`peer_thread`: one per
# conversation of the sender); task results into the delegating turn's thread (`reply_to`).
# `eventossender` names the employee an internal wake comes from.
ATTR_SENDER: Final = "eventossender"
TYPE_IPC_MESSAGE: Final = "eventos.ipc.message"
TYPE_IPC_TASK: Final = "eventos.ipc.task"
TYPE_IPC_RESULT: Final = "eventos.ipc.task.result"
TYPE_IPC_TIMED_OUT: Final = "eventos.ipc.task.timed_out"
TYPE_IPC_DIGEST: Final = "eventos.ipc.digest"
TYPE_IPC_MESSAGE_EXPIRED: Final = "eventos.ipc.message.expired"  # the sender's notice (SPEC §15)
TYPE_IPC_TASK_EXPIRED: Final = "eventos.ipc.task.expired"  # the delegator's notice (SPEC §15)
IPC_ROUTE_KIND: Final = "ipc"
TASK_OPEN: Final = "open"
TASK_DONE: Final = "done"
TASK_TIMED_OUT: Final = "timed_out"
TASK_CANCELLED: Final = "cancelled"
TASK_EXPIRED: Final = "expired"  # undelivered past the staleness bound (SPEC §15)
IPC_STALE_AFTER_S: Final = 86400.0  # messages and tasks undelivered this long expire (SPEC §15)
IPC_EXPIRE_BATCH: Final = 100  # expired by one pass of the router's messaging upkeep
IPC_TEXT_MAX: Final = 16 * 1024  # characters of a message, task or result
IPC_OPEN_TASKS_MAX: Final = 200  # open tasks one employee has delegated (SPEC §15)
IPC_PENDING_MAX: Final = 500  # undelivered ipc inputs per target (SPEC §15)
IPC_DEADLINE_MAX_S: Final = 30 * 86400
IPC_UPKEEP_EVERY_S: Final = 5.0  # the router's digest check and staleness sweep
STORM_HOPS_MAX: Final = 8
STORM_RATE_PER_MIN: Final = 10.0  # per edge (sender → target)
STORM_BURST: Final = 20.0
STORM_WINDOW_S: Final = 60  # an exhausted window: a minute in which the bucket ran dry
STORM_WINDOWS_TO_OPEN: Final = 3  # exhausted windows in a row open the breaker
STORM_DIGEST_EVERY_S: Final = 900  # an open edge delivers one digest per 15 minutes
STORM_HALF_OPEN_AFTER_S: Final = 3600
STORM_DIGEST_TEXTS_MAX: Final = 20  # texts a digest quotes (it counts them all)
STORM_DIGEST_TEXT_CHARS: Final = 500
BREAKER_CLOSED: Final = "closed"
BREAKER_OPEN: Final = "open"
BREAKER_HALF_OPEN: Final = "half_open"
LOOP_SUPPRESSED: Final = "loop_suppressed"  # the reason prefix of a cut wake (dead, I3)
STORM_DIGESTED: Final = "digested"  # the reason of an ingress row taken into a digest
ATTENTION_BREAKER_OPEN: Final = "breaker_open"
ATTENTION_LOOP_SUPPRESSED: Final = "loop_suppressed"

# Alarms and follow-ups (SPEC §10, §15): rows in `alarms`, fired by the supervisor's one timer
# into the thread that set them (source `alarm:<employee>`, dedupe `alarm:<id>[:<occurrence>]`).
SIGNAL_ALARMS_CHANGED: Final = "alarms_changed"  # a hint: the supervisor reads the earliest again
ACT_FIRE_ALARMS: Final = "fire_due_alarms"
ALARM_SCHEDULED: Final = "scheduled"
ALARM_FIRED: Final = "fired"
ALARM_MISSED: Final = "missed"
ALARM_CANCELLED: Final = "cancelled"
ALARM_KIND: Final = "alarm"  # set by the alarm tools
DEADLINE_KIND: Final = "deadline"  # set by other subsystems (a task's deadline)
TYPE_ALARM_FIRED: Final = "eventos.alarm.fired"
TYPE_DEADLINE_DUE: Final = "eventos.deadline.due"
ALARM_TYPES: Final = {ALARM_KIND: TYPE_ALARM_FIRED, DEADLINE_KIND: TYPE_DEADLINE_DUE}
ALARMS_MAX_PER_EMPLOYEE: Final = 500
CANCEL_ON_INBOUND: Final = "inbound"
IF_LATE_FIRE: Final = "fire"
IF_LATE_SKIP_PREFIX: Final = "skip_after:"
ATTENTION_MISSED_ALARM: Final = "missed_alarm"
# Trigger kinds whose deliveries are inbound messages: they cancel their thread's follow-ups
# (alarms, employee messages, tool retries, ticks and watched data do not).
INBOUND_KINDS: Final = ("chat", "webhook", "grpc", *CHANNEL_KINDS)

# Content rules (SPEC §11): a match holds an outgoing message with the rule's id as held_reason.
RULE_RECIPIENT_OUTSIDE: Final = "recipient-outside"  # built in: the recipient is no participant
RULE_TOO_LONG: Final = "too-long-to-scan"  # built in: longer than the rules scan
BUILTIN_RULES: Final = (RULE_RECIPIENT_OUTSIDE, RULE_TOO_LONG)
CONTENT_RULES_MAX: Final = 100
RULE_ITEMS_MAX: Final = 100  # words of a keyword rule, domains of a domain rule
RULE_WORD_MAX_CHARS: Final = 200
DOMAIN_MAX_CHARS: Final = 253  # DNS: a longer name never resolves
RULE_PATTERN_MAX_CHARS: Final = 1000
RULES_TOTAL_MAX_CHARS: Final = 64 * 1024  # every word, pattern and domain of a spec together
RULE_REGEX_MAX_MEM: Final = 1024 * 1024  # RE2's budget per compiled pattern (program + DFA)
RULES_SCAN_MAX_CHARS: Final = 64 * 1024  # an outgoing message fits the 64 KB envelope (I7)

# Supervision (SPEC §12): restart intensity per thread, the `degraded` employee, the watchdogs.
HOLD_BACKOFF: Final = "backoff"  # a thread's failing turns back it off until `hold_until`
HOLD_QUARANTINED: Final = "quarantined"  # until the owner releases it
HOLD_DEGRADED: Final = "degraded"  # background work of a degraded employee (like `budget`)
GATE_BACKOFF: Final = HOLD_BACKOFF
GATE_QUARANTINED: Final = HOLD_QUARANTINED
GATE_DEGRADED: Final = HOLD_DEGRADED
ATTENTION_THREAD_QUARANTINED: Final = "thread_quarantined"
ATTENTION_EMPLOYEE_DEGRADED: Final = "employee_degraded"
ATTENTION_ROUTER_STALLED: Final = "router_stalled"
ATTENTION_WINDOW_STALLED: Final = "window_stalled"
ATTENTION_STUCK_RETRY: Final = "stuck_retry"
ATTENTION_STUCK_TURN: Final = "stuck_turn"  # a turn holding a slot, no step progress for 10 min
ATTENTION_WORKFLOW_TASK_FAILING: Final = "workflow_task_failing"  # Temporal flagged a workflow
ACTION_RELEASE: Final = "release"  # a quarantined thread's held inputs flow again
ACTION_CLEAR: Final = "clear"  # the owner clears a degraded employee
# The `employee` of an item about the whole instance (no employee name has parentheses).
INSTANCE_ITEMS: Final = "(instance)"
# Upgrades (issue 29, docs/upgrades.md): a generation whose open runs the new release cannot
# replay (its action: Reset), and an upgrade that rolled back or needs a human.
ATTENTION_NEEDS_RESET: Final = "needs_reset"
ATTENTION_UPGRADE_ROLLED_BACK: Final = "upgrade_rolled_back"
ATTENTION_UPGRADE_FAILED: Final = "upgrade_failed"

# Operator surfaces (issue 16): attention item states and the actions items offer
# (`POST /v1/attention/{id}:act`, besides ACTION_RETRY); dead letters, named `<kind>-<id>`.
ITEM_OPEN: Final = "open"
ITEM_ACKED: Final = "acked"  # seen and being handled: listed until resolved, repeats count on it
ITEM_RESOLVED: Final = "resolved"
ITEM_STATES: Final = (ITEM_OPEN, ITEM_ACKED, ITEM_RESOLVED)
ACTION_RESUME: Final = "resume"
ACTION_RESET: Final = "reset"
ACTION_REPLAY: Final = "replay"
LETTER_INGRESS: Final = "ingress"  # an ingress row settled dead (never routed)
LETTER_DELIVERY: Final = "delivery"  # a delivery settled dead (its input never consumed)

# The employee timeline (SPEC §12, §15; docs/timeline.md): entry kinds by family, retention.
TIMELINE_RETENTION_DAYS: Final = 30
TIMELINE_KINDS: Final = {
    "input": ("input.accepted", "input.routed", "input.delivered", "input.pending", "input.dead",
              "input.skipped"),
    "turn": ("turn.started", "turn.parked", "turn.done", "turn.failed", "turn.cancelled",
             "turn.interrupted"),
    "reply": ("reply.queued", "reply.held", "reply.sent", "reply.failed", "reply.unknown",
              "reply.expired"),
    "alarm": ("alarm.set", "alarm.fired", "alarm.missed", "alarm.cancelled"),
    "task": ("task.delegated", "task.done", "task.timed_out", "task.cancelled"),
    "tool": ("tool.done", "tool.unknown", "tool.failed"),
    "attention": ("attention.raised",),
    "transcript": ("transcript.viewed",),  # the admin read a turn's transcript (console)
}  # fmt: skip

# The operator event stream (issue 16, `GET /v1/events`; docs/events.md): kinds by family,
# retention.
OPERATOR_EVENTS_RETENTION_DAYS: Final = 7
OPERATOR_EVENT_KINDS: Final = {
    "turn": ("turn.started", "turn.parked", "turn.done", "turn.failed", "turn.cancelled",
             "turn.interrupted"),
    "outbox": ("outbox.queued", "outbox.held", "outbox.sent", "outbox.failed", "outbox.unknown",
               "outbox.expired"),
    "dead_letter": ("dead_letter.added",),
    "attention": ("attention.raised", "attention.acked", "attention.resolved"),
    "approval": ("approval.created", "approval.decided", "approval.expired"),
    "employee": ("employee.starting", "employee.running", "employee.paused", "employee.retired",
                 "employee.degraded", "employee.recovered", "employee.deleted"),
}  # fmt: skip

# Every tool an agent may name in `agents[].tools` (the spec checks names against this set;
# eventos.tools.registry holds each one's handler and refuses to load unless it has exactly these).
TOOL_NAMES: Final = frozenset({
    "set_alarm", "list_alarms", "cancel_alarm",
    "send_to_employee", "delegate_to_employee", "complete_task",
    "http_request",
    "data_get", "data_put", "data_list",
})  # fmt: skip

# Flags of a generation (`spec.flags`, SPEC §3, EG2): each documented name with its default and
# what it does (docs/operations.md#flags). A generation freezes them with its snapshot; its
# workflows read them from their input (StreamCursor, TurnInput), never from the database.
# Applying a spec whose flags differ to a live generation drains it into a new one.
FLAG_CONCURRENT_READ_ONLY_TOOLS: Final = "concurrent_read_only_tools"
FLAGS: Final[dict[str, tuple[bool, str]]] = {
    FLAG_CONCURRENT_READ_ONLY_TOOLS: (
        False,
        "a model response whose tool calls are all read-only runs them concurrently, at most "
        "8 at once, and appends the results in call order (RFC-0006 §6.3)",
    ),
}
READ_ONLY_BATCH_MAX_AT_ONCE: Final = 8  # concurrent read-only calls of one model response
# A flag change drains the live generation into a new one (eventos.employees.drain): the old one
# is stopped with this pause reason until its running turns have stopped, then retired.
PAUSE_DRAIN: Final = "drain"
ATTENTION_GENERATION_DRAINED: Final = "generation_drained"  # the owner's notice of a drain
DRAIN_WAIT_MAX_S: Final = 600  # the drain waits this long for the old turns to stop, then fails
DRAIN_RECHECK_S: Final = 1.0  # how soon the deliverer looks again while the old turns stop


def entity_id(employee: str, generation: int, lane: str, thread: str) -> str:
    """A stream's ConversationWorkflow id, `conv-<employee>-g<gen>-<lane>-<thread>`."""
    return f"conv-{employee}-g{generation}-{lane}-{thread}"
