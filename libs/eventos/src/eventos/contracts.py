"""Dataclasses that cross services and Temporal. Side-effect free: workflows import them."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from eventos import names


@dataclass(frozen=True)
class StreamCursor:
    """A ConversationWorkflow's argument: which stream it serves and what it already applied."""

    stream_key: str
    employee: str
    generation: int
    lane: str
    thread: str
    applied_seq: int
    # Inputs delivered after this seq (through applied_seq) and not yet consumed are read back
    # from the database instead of being carried (I7: cursors only): after continue-as-new, and
    # on a relay start (a run replacing a lost one starts with what its predecessor held).
    reload_after: int | None = None
    roll_after: int = names.ENTITY_ROLL_AFTER  # continue-as-new between turns past this many
    idle_s: float | None = None  # passivate after this idle time (None: the lane's default)
    cancel_grace_s: float = names.TURN_CANCEL_GRACE_S  # then a cancelled turn is terminated
    # Failed tries so far of inputs still pending, as [seq, tries] (carried by continue-as-new,
    # so a failed input is still retried once only, then dead-lettered).
    failures: list[list[int]] = field(default_factory=list)
    # The generation's flags (names.FLAGS), frozen with its snapshot; the relay reads them with
    # the stream, continue-as-new carries them and each turn gets them in its input.
    flags: dict[str, bool] = field(default_factory=dict)
    # Its turns' attempt timeouts (settings.TurnTimeouts, the relay's): carried like the flags.
    send_timeout_s: float = names.SEND_CLAIM_TTL_S
    llm_heartbeat_s: float = names.LLM_HEARTBEAT_S
    # The workflow queue its turns run on (names.turn_queue, the relay's; carried like the
    # flags); None: the entity's own.
    turn_queue: str | None = None


@dataclass(frozen=True)
class DeliveryItem:
    """One input as the entity sees it (payload ≤ 64 KB, or a body reference)."""

    seq: int
    ingress_id: int
    klass: int
    type: str
    route: dict[str, Any]
    chain_id: str
    hop: int
    size: int
    payload: dict[str, Any] | None = None
    body_ref: str | None = None
    causation_id: str | None = None
    waited_s: float | None = None  # how long it waited in the bus before this delivery

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> DeliveryItem:
        """From a `bus_deliveries` row (with its `age_s` when the query reads it)."""
        age = row.get("age_s")
        return cls(
            seq=int(row["seq"]), ingress_id=int(row["ingress_id"]), klass=int(row["class"]),
            type=str(row["type"]), route=row["route"], chain_id=str(row["chain_id"]),
            hop=int(row["hop"]), size=int(row["size"]), payload=row["payload"],
            body_ref=row["body_ref"], causation_id=row["causation_id"],
            waited_s=None if age is None else max(0.0, float(age)),
        )  # fmt: skip


@dataclass(frozen=True)
class DeliverBatch:
    """What one `deliver` Signal carries: at most 16 items or 256 KB, in seq order."""

    stream_key: str
    items: list[DeliveryItem] = field(default_factory=list)


@dataclass(frozen=True)
class EntityStatus:
    """The `status` Query of a ConversationWorkflow."""

    stream_key: str
    applied_seq: int
    pending: int
    received: int
    dropped: int
    signals: int
    turn_id: str | None = None
    turn_class: int | None = None
    slot_of: str | None = None  # the turn whose admission slot the entity still holds


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for; `arguments` is the model's JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One transcript message (OpenAI chat-completions roles)."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


def message_size(message: ChatMessage) -> int:
    """A message's size as the bounds count it: its JSON."""
    return len(json.dumps(asdict(message)))


def bounded_transcript(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Drop the oldest messages (never the system prompt) until ≤ 393,216 bytes (I7)."""
    size = [message_size(m) for m in messages]
    keep_from = 1
    while (
        sum(size[:1]) + sum(size[keep_from:]) > names.TRANSCRIPT_MAX_BYTES
        and keep_from < len(messages) - 1
    ):
        keep_from += 1
    return messages[:1] + messages[keep_from:]


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model: JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelRef:
    """Which model answers: provider `openai` (any OpenAI-compatible endpoint) or `local`."""

    provider: str
    name: str
    credential: str | None = None
    base_url: str | None = None
    endpoint: str | None = None  # an operator's endpoint by name (EVENTOS_LLM_ENDPOINTS)
    # The spec's `options.token_limit_param`: which request field carries the token limit
    # (`max_tokens` or `max_completion_tokens`); None lets the provider pick by model family.
    token_limit_param: str | None = None

    def is_local(self) -> bool:
        """A local endpoint (the local provider, or one on this host or a private network):
        its steps get the longer outage budget (SPEC §9: 30 min, not 10)."""
        if self.provider == "local":
            return True
        host = urlsplit(self.base_url or "").hostname or ""
        if host == "localhost" or host.endswith(".local"):
            return True
        try:
            return ipaddress.ip_address(host).is_private
        except ValueError:
            return False


@dataclass(frozen=True)
class TranscriptRef:
    """A conversation's stored transcript as a turn loaded it: messages 1..`through`, whose
    bytes end at `through_bytes`. Rows are only appended, so every attempt of a step reads the
    same messages (eventos.conversations.transcripts)."""

    generation: int
    agent: str
    thread: str
    through: int
    through_bytes: int


@dataclass(frozen=True)
class LlmStepInput:
    """One model call of a turn: the system prompt and the turn's own messages; the stored
    transcript is read by `transcript` (kept out of Temporal payloads). `messages` is the one
    payload allowed past 64 KB (I7): a step of a run begun before 0015 carries it whole."""

    employee: str
    turn_id: str
    step: int
    klass: int
    model: ModelRef
    messages: list[ChatMessage]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 1024
    transcript: TranscriptRef | None = None


@dataclass(frozen=True)
class LlmStepOutput:
    """The model's answer: an assistant message (text and/or tool calls) and its usage."""

    message: ChatMessage
    finish_reason: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class AdmitRequest:
    """Asks admission for a turn slot (SPEC §9); the grant allocates the turn number."""

    employee: str
    generation: int
    agent: str
    thread: str
    stream_key: str
    klass: int
    workflow_id: str = ""  # the entity to wake when a slot is offered
    turn_id: str = ""  # a suspended turn taking its slot again
    # The entity's key of this ask (its run id and the ask's number): an ask repeated because
    # its answer was lost is given the turn already granted, not a second one.
    ask: str = ""
    # The entity takes what the relay held for it while it waits (patch `take-held-on-grant`):
    # queued, it is sent no input of this class or below (`sched_waiters.takes_held`).
    holds: bool = False
    # Asking again after it was queued with `holds`: its last applied seq, and a grant carries
    # the inputs after it that the relay held (eventos.delivery.held). None: nothing to take.
    take_after: int | None = None


@dataclass(frozen=True)
class Admission:
    """Admission's answer: granted, or queued (wait for `wake`), or refused by a gate."""

    granted: bool
    turn_id: str = ""
    n: int = 0
    reason: str = ""
    gate: str = ""  # "paused" / "budget" (wait for `wake`) or "retired" (close)
    reserved: bool = False  # the employee's reserved owner slot
    retry_after_s: float = 0.0  # gate "backoff": ask again after this
    # Granted to an ask with `take_after`: the stream's inputs after it that the relay held
    # (within one batch's bounds, 16 inputs or 256 KB, and the window's room), in seq order.
    inputs: list[DeliveryItem] = field(default_factory=list)


@dataclass(frozen=True)
class TurnInput:
    """A TurnWorkflow's argument: its conversation and the inputs it consumes."""

    turn_id: str
    employee: str
    generation: int
    agent: str
    thread: str
    stream_key: str
    klass: int
    route: dict[str, Any]
    inputs: list[DeliveryItem]
    flags: dict[str, bool] = field(default_factory=dict)  # the generation's (StreamCursor)
    # Signal `inputs_consumed` after the save: only turns of entities from before the patch
    # `consumed-from-database` (their argument lacks the field), which learn nothing otherwise.
    tell_consumed: bool = True
    # Its sends' and model steps' attempt timeouts, from its entity's cursor (turns of entities
    # begun before these fields existed take the defaults, as before).
    send_timeout_s: float = names.SEND_CLAIM_TTL_S
    llm_heartbeat_s: float = names.LLM_HEARTBEAT_S


@dataclass(frozen=True)
class OfferInputs:
    """Inputs delivered during a turn on its route, offered for merge point B1."""

    items: list[DeliveryItem]


@dataclass(frozen=True)
class TurnResult:
    """How a turn ended (`done` or `interrupted`), the seqs it consumed and what it sent."""

    turn_id: str
    status: str
    consumed: list[int]
    outbound_id: int | None
    dead_letter: str | None = None  # parked too long: its inputs are dead-lettered at once


@dataclass(frozen=True)
class InputsConsumed:
    """A turn's consuming save committed: these inputs are gone from the entity's pending."""

    turn_id: str
    seqs: list[int]


@dataclass(frozen=True)
class InterruptTurn:
    """The `interrupt_turn` Update: stop that turn at its next merge point (SPEC §8)."""

    turn_id: str
    by_class: int = 1
    reason: str = "interrupted by the owner"


@dataclass(frozen=True)
class TerminateWorkflow:
    """The last resort when a cancelled workflow does not close in time."""

    workflow_id: str
    reason: str


@dataclass(frozen=True)
class RunEnded:
    """An entity run's figures as it ends (`rolled` into a new run, or `closed`)."""

    end: str
    signals: int
    history_bytes: int


@dataclass(frozen=True)
class RunEvent:
    """A run event on the owner's chat event stream (`run.start`, `run.input_merged`)."""

    employee: str
    session: str
    turn_id: str
    kind: str
    ingress_ids: list[int]
    audience: str = "owner"  # whose chat: a user's name, or `owner` (the admin)


@dataclass(frozen=True)
class ConversationContext:
    """What a turn loads: its model, system prompt, tools and the stored transcript's version
    (`stored`). `transcript` is what a run begun before 0015 loaded inline (histories keep it);
    new runs load none."""

    model: ModelRef
    system: str
    transcript: list[ChatMessage] = field(default_factory=list)
    tools: list[ToolSpec] = field(default_factory=list)
    stored: TranscriptRef | None = None
    approve_tools: list[str] = field(default_factory=list)  # calls that wait for the owner


@dataclass(frozen=True)
class SaveTurn:
    """The consuming save: transcript and consumed_seq in one transaction, plus the reply."""

    turn: TurnInput
    new_messages: list[ChatMessage]
    consumed_seqs: list[int]
    consumed_ingress_ids: list[int]
    reply: str | None


@dataclass(frozen=True)
class Saved:
    """The outbox row the reply was written to (none when the turn had nothing to say), its
    channel kind (`chat`: owner chat, sent by a local activity of the turn) and account."""

    outbound_id: int | None
    kind: str | None = None
    account: str | None = None  # a channel send's account: the egress task's fairness key
    approval_id: str | None = None  # the send is held for the owner's approval


@dataclass(frozen=True)
class HoldToolCall:
    """A tool call that needs the owner's approval before it runs (SPEC §11)."""

    employee: str
    generation: int
    stream_key: str
    turn_id: str
    call_id: str
    name: str
    arguments: str
    route: dict[str, Any]


@dataclass(frozen=True)
class ApprovalView:
    """An approval as its workflow reads it (the database's clock decides the deadlines)."""

    state: str
    taken: bool
    expires_in_s: float
    remind_in_s: float | None


@dataclass(frozen=True)
class ReleaseTurn:
    """A turn gives its admission slot back."""

    turn_id: str
    status: str  # "done" | "failed" | "cancelled" | "interrupted"
    error: str | None = None


@dataclass(frozen=True)
class SuspendTurn:
    """A turn stops holding its slot (it keeps the lease, suspended, under its id): for the
    budget, or parked (`parked: <why>`) with an attention item."""

    turn_id: str
    reason: str
    employee: str = ""
    detail: str = ""


@dataclass(frozen=True)
class UpgradeLease:
    """Priority inheritance: the turn's lease moves up to `klass`."""

    turn_id: str
    klass: int


@dataclass(frozen=True)
class DeadLetter:
    """A turn's inputs that failed twice: settled as dead, with a reason the owner sees."""

    employee: str
    stream_key: str
    turn_id: str
    seqs: list[int]
    ingress_ids: list[int]
    reason: str


@dataclass(frozen=True)
class ToolFailed:
    """A tool call that failed for good (its activity's retries spent): its timeline entry
    with the cause (eventos.failures: category, type, bounded message)."""

    turn_id: str
    call_id: str
    tool: str
    error: str


@dataclass(frozen=True)
class SkipInputs:
    """Ticks settled without a turn: their trigger's turn was running (`on_busy: skip`)."""

    stream_key: str
    seqs: list[int]
    reason: str


@dataclass(frozen=True)
class ReloadInputs:
    """Which delivered, unconsumed inputs a continued entity reads back."""

    stream_key: str
    after: int
    through: int


@dataclass(frozen=True)
class Control:
    """A supervisor's control block: absolute values and the revision that set them."""

    state: str  # "starting" | "running" | "paused" | "retired" (the generation's state)
    revision: int
    limits: dict[str, Any] = field(default_factory=dict)
    pause_reason: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Control:
        """From a generation's row (`state`, `control_revision`, `limits`, `pause_reason`)."""
        return cls(str(row["state"]), int(row["control_revision"]), dict(row["limits"]),
                   row["pause_reason"])  # fmt: skip


@dataclass(frozen=True)
class SupervisorInput:
    """An EmployeeSupervisorWorkflow's argument: built from the database on every start (so a
    lost supervisor is rebuilt in place), carried as is across continue-as-new."""

    employee: str
    generation: int
    control: Control
    continued: bool = False  # a continue-as-new run: the world already matches the control
    roll_after: int = names.SUPERVISOR_ROLL_UPDATES  # continue-as-new at this many Updates


@dataclass(frozen=True)
class SetControl:
    """The `set_control_state` Update: the new state and the revision that sets it."""

    state: str
    revision: int
    pause_reason: str | None = None


@dataclass(frozen=True)
class SetLimits:
    """The `set_limits` Update: the whole limits block and the revision that sets it."""

    limits: dict[str, Any]
    revision: int


@dataclass(frozen=True)
class SupervisorStatus:
    """The supervisor's `status` Query (and every Update's answer)."""

    employee: str
    generation: int
    state: str
    revision: int
    limits: dict[str, Any]
    updates: int
    deadlines: dict[str, str]  # name → UTC instant (ISO 8601)


@dataclass(frozen=True)
class ApplyControl:
    """What the supervisor's activities make true in Temporal for a generation's state."""

    employee: str
    generation: int
    state: str
    first: bool = False  # the supervisor's first run: activate, fire `start` once, make schedules
    pause_reason: str | None = None  # a budget pause leaves running turns to suspend


@dataclass(frozen=True)
class BudgetRefresh:
    """The supervisor asks the ledger to lower the budget's state (period end or top-up)."""

    employee: str
    generation: int


@dataclass(frozen=True)
class BudgetStatus:
    """The ledger's answer: its state, the period's end (the supervisor's `budget` deadline)
    and the control block when the budget pause was lifted."""

    state: str
    period_end: datetime
    control: Control | None = None


@dataclass(frozen=True)
class ScheduleFire:
    """A cron Schedule's action argument: which trigger of which generation fires."""

    employee: str
    generation: int
    trigger: str
    schedule_id: str
    text: str = ""  # the trigger's text, what the tick says to the agent


@dataclass(frozen=True)
class ToolCallInput:
    """One tool call of a turn, as its activity runs it (SPEC §10, §11). `chain_id`, `hop`
    and `path` are the turn's causal context: the max hop and the union of the paths of the
    inputs it consumed (I8); every internal wake the call makes carries them on."""

    employee: str
    generation: int
    agent: str
    thread: str
    lane: str
    stream_key: str
    turn_id: str
    call_id: str
    name: str
    arguments: str  # the model's JSON text
    klass: int
    route: dict[str, Any]
    chain_id: str
    hop: int
    path: list[str] = field(default_factory=list)
    woken_by: list[str] = field(default_factory=list)  # types of the consumed inputs
    retry_of: str | None = None  # the key of the unknown call the owner asked to run again
    woken_tasks: list[str] = field(default_factory=list)  # ids of delegated tasks consumed

    @property
    def key(self) -> str:
        """The call's identity across attempts and the continue-as-new chain."""
        return f"{self.turn_id}:{self.call_id}"


@dataclass(frozen=True)
class ToolResult:
    """What the model reads back (a tool message) and how the call ended."""

    content: str
    outcome: str  # names.TOOL_OK | TOOL_REFUSED | TOOL_UNKNOWN | TOOL_FAILED


@dataclass(frozen=True)
class PollTrigger:
    """PollWorkflow's argument: which poll trigger of which generation it reads. The trigger's
    definition is read from the generation's frozen spec at each attempt (I10)."""

    employee: str
    generation: int
    trigger: str


@dataclass(frozen=True)
class FireAlarms:
    """The supervisor's `fire_due_alarms` activity: fire what is due for this generation."""

    employee: str
    generation: int


@dataclass(frozen=True)
class AlarmsDue:
    """What `fire_due_alarms` did, and the earliest scheduled alarm left (the supervisor's
    `alarms` deadline; None when there is none)."""

    fired: int
    missed: int
    next_due: datetime | None
