"""TurnWorkflow, the agent loop of one turn (SPEC §7, §8).

Load the conversation; per step, merge offered inputs first (B1), then one LLM step on the
class queue with an activity id unique across the chain; tool calls are answered before the
next step (a batch is never split). On customer channels a final answer that more messages
overtook is kept as a draft and the turn takes one more step (B2, at most twice). The final
answer is saved with the consumed inputs in one transaction (the consuming save) and the reply
is sent through the outbox; the entity learns which inputs are gone from the turn's result (or,
when the turn fails or is cancelled after its save, from the database). Only a turn whose entity
began before the patch `consumed-from-database` signals it `inputs_consumed` (`tell_consumed`).
A merged input of a higher class moves the rest of the turn to its class (priority
inheritance: queue, priority key and admission lease).

An owner Interrupt stops the turn at its next merge point, before anything is saved: its
inputs return to the entity's pending list. A step the budget refuses (`BudgetHeld` for
background work past 80%, `BudgetExceeded` past 100%) suspends the turn: it gives its slot
back and waits for `released` (the budget's period ended or a top-up) or `wake` (a slot is
offered), then takes its slot again under the same turn id and retries the step. A
cancelled turn cancels its running activity and waits for it (the LLM step heartbeats, so
that takes well under 2 minutes); a save already under way finishes, and its settled deliveries
keep consumed inputs from being run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import Priority, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout
from temporalio.workflow import (
    ActivityCancellationType,
    ChildWorkflowCancellationType,
    ParentClosePolicy,
)

with workflow.unsafe.imports_passed_through():
    import eventos.failures as failures
    import eventos.names as names
    import eventos.tools.registry as tool_registry
    import eventos.workflows.policies as policies
    from eventos.alarms.timing import humanize
    from eventos.contracts import (
        Admission,
        AdmitRequest,
        ChatMessage,
        ConversationContext,
        DeliveryItem,
        HoldToolCall,
        InputsConsumed,
        LlmStepInput,
        LlmStepOutput,
        OfferInputs,
        RunEvent,
        Saved,
        SaveTurn,
        SuspendTurn,
        ToolCall,
        ToolCallInput,
        ToolFailed,
        ToolResult,
        TurnInput,
        TurnResult,
        UpgradeLease,
        bounded_transcript,
    )


BUDGET_REFUSALS = ("BudgetExceeded", "BudgetHeld")
# Failures that may clear: the turn parks instead of failing (SPEC §9).
# An endpoint off the operator's list (EVENTOS_LLM_ENDPOINTS) is configuration, like a key.
PARK_TYPES = ("ProviderQuotaExceeded", "ProviderAuthError", "ProviderCredentialMissing",
              names.LLM_ENDPOINT_NOT_ALLOWED, names.PROVIDER_OUTAGE)  # fmt: skip
SUSPENDED_RECHECK = timedelta(minutes=10)  # a suspended turn asks again (Signals are hints)
PARK_PROBE = timedelta(minutes=15)
# Workflow changes that running turns must replay as they were (Temporal's patching): remove a
# patch's old branch two releases after it shipped (docs/turns.md).
PATCH_TOOLS = "tools-as-activities"
PATCH_LOCAL_CHAT_SEND = "owner-chat-send-local"
PATCH_TOOL_APPROVALS = "tool-approvals"  # calls named in spec.approvals.tools wait for the owner
PATCH_TOOL_FAILED = "tool-failed-entry"  # a call failed for good writes its cause's entry
# A batch of read-only calls runs at once when the generation's flag says so (RFC-0006 §6.3).
PATCH_READ_ONLY_BATCH = "read-only-batch-at-once"


def hold_reason(exc: ActivityError) -> str | None:
    """Why a failed step holds the turn instead of failing it: the budget, or a park (by the
    first cause that says, walking down: eventos.failures.causes)."""
    for cause in failures.causes(exc):
        if isinstance(cause, ApplicationError) and cause.type in BUDGET_REFUSALS:
            return names.PAUSE_BUDGET
        if isinstance(cause, ApplicationError) and cause.type in PARK_TYPES:
            return f"{names.PARKED}: {cause.type}"
        if isinstance(cause, ActivityTimeout):  # the step's whole time budget went by: outage
            return f"{names.PARKED}: {names.PROVIDER_OUTAGE}"
    return None


def late_note(item: DeliveryItem, now: datetime | None) -> str:
    """SPEC §15: a customer's message the model reads more than CUSTOMER_LATE_NOTE_AFTER_S
    after the customer sent it (the event's `time`, the provider's own) says so, as a late
    alarm does, so the answer can take the wait into account; else nothing."""
    if now is None or item.route.get("kind") not in names.CHANNEL_KINDS:
        return ""
    sent = (item.payload or {}).get("time")
    try:
        at = datetime.fromisoformat(sent) if isinstance(sent, str) else None
    except ValueError:
        return ""
    if at is None or at.tzinfo is None:
        return ""
    late = (now - at).total_seconds()
    if late <= names.CUSTOMER_LATE_NOTE_AFTER_S:
        return ""
    return f"\n[late: sent at {at.isoformat()}, read {humanize(late)} later]"


def user_message(item: DeliveryItem, now: datetime | None = None) -> ChatMessage:
    """An input as the model reads it: chat text (a customer's message read late with its
    lateness note), else the event's JSON (or its reference)."""
    data = (item.payload or {}).get("data")
    if isinstance(data, dict) and isinstance(data.get("text"), str):
        return ChatMessage("user", data["text"] + late_note(item, now))
    if item.body_ref:
        return ChatMessage("user", f"[{item.type} event; body stored as {item.body_ref}]")
    return ChatMessage("user", f"[{item.type} event] {json.dumps(data, sort_keys=True)[:8000]}")


def b2_note(count: int) -> ChatMessage:
    """Merge point B2: the draft above was not sent; answer it and the newer messages at once."""
    return ChatMessage("user", f"[{count} more message(s) arrived before your answer was sent; "
                               "it was not sent. Reply once, covering everything.]")  # fmt: skip


def tool_failure_reason(exc: ActivityError) -> str:
    """What the model reads of a failed call: the activity's fixed reason (or a missing
    generation's), never an error's own text; a time-out as such (by the first cause that
    says, walking down: eventos.failures.causes)."""
    for cause in failures.causes(exc):
        if isinstance(cause, ApplicationError):
            if cause.type == "NotFound":
                return cause.message
            return names.TOOL_REASONS.get(cause.type or "", names.TOOL_REASON_INTERNAL)
        if isinstance(cause, ActivityTimeout):
            return names.TOOL_REASON_TIMEOUT
    return names.TOOL_REASON_INTERNAL


def tool_unavailable(call: ToolCall) -> ChatMessage:
    return ChatMessage("tool", f"error: tool {call.name!r} is not available", tool_call_id=call.id)


def tool_message(call: ToolCall, result: ToolResult) -> ChatMessage:
    return ChatMessage("tool", result.content, tool_call_id=call.id, name=call.name)


def causal(items: list[DeliveryItem]) -> tuple[str, int, list[str]]:
    """The turn's causal context (I8): the first input's chain, the max hop, the union of the
    inputs' paths (the employees their wakes went through), in first-seen order."""
    path: list[str] = []
    for item in items:
        for who in (item.payload or {}).get(names.ATTR_PATH) or []:
            if isinstance(who, str) and who not in path:
                path.append(who)
    return items[0].chain_id, max(i.hop for i in items), path[: names.STORM_PATH_MAX]


# What every call of a turn carries about its wake: chain, hop, path, input types, tasks.
Woke = tuple[str, int, list[str], list[str], list[str]]


def task_ids(items: list[DeliveryItem]) -> list[str]:
    """The delegated tasks among the inputs, in order (`complete_task`'s default)."""
    out: list[str] = []
    for item in items:
        data = (item.payload or {}).get("data")
        if item.type == names.TYPE_IPC_TASK and isinstance(data, dict):
            task = data.get("task_id")
            if isinstance(task, str) and task not in out:
                out.append(task)
    return out


@workflow.defn(name=names.WF_TURN)
class TurnWorkflow:
    """One turn over a prefix of a conversation's inputs."""

    @workflow.init
    def __init__(self, turn: TurnInput) -> None:
        self.offered: list[DeliveryItem] = []
        self.merged = 0
        self.drafts = 0  # B2 uses
        self.stop_reason: str | None = None
        self.resumes = 0  # suspensions left behind (each retries its step under a new id)
        self.nudges = 0  # `released` and `wake` Signals
        self.klass = turn.klass  # raised by a merged input of a higher class
        self.approve_tools: list[str] = []  # tools whose calls wait for the owner's approval
        self.cause = ""  # why the last step failed (eventos.failures), shown with a park

    @workflow.signal(name=names.SIGNAL_OFFER)
    def offer_inputs(self, offer: OfferInputs) -> None:
        self.offered.extend(offer.items)

    @workflow.signal(name=names.SIGNAL_STOP_AT_MERGE)
    def stop_at_merge_point(self, reason: str) -> None:
        """Interrupt: end at the next merge point without saving (the entity validated it)."""
        self.stop_reason = reason or "interrupted"

    @workflow.signal(name=names.SIGNAL_RELEASED)
    def released(self, reason: str) -> None:
        """The budget lets the suspended turn go on (a hint: it asks admission)."""
        self.nudges += 1

    @workflow.signal(name=names.SIGNAL_WAKE)
    def wake(self) -> None:
        """Admission offers the suspended turn a slot."""
        self.nudges += 1

    @workflow.query(name=names.QUERY_STATUS)
    def status(self) -> dict[str, int]:
        return {"offered": len(self.offered), "merged": self.merged, "drafts": self.drafts,
                "stopping": int(self.stop_reason is not None), "resumes": self.resumes}  # fmt: skip

    async def _merged(self, turn: TurnInput, step: int, items: list[DeliveryItem]) -> None:
        """Tell the owner's session that its messages joined the running turn."""
        if turn.route.get("kind") != "chat":
            return
        session = str(turn.route.get("session") or "owner")
        audience = str(turn.route.get("audience") or "owner")
        event = RunEvent(turn.employee, session, turn.turn_id, names.RUN_INPUT_MERGED,
                         [i.ingress_id for i in items], audience)  # fmt: skip
        await workflow.execute_local_activity(
            names.ACT_RUN_EVENT, event, activity_id=f"{turn.turn_id}:merged-{step}",
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip

    async def _inherit(self, turn: TurnInput, klass: int) -> None:
        """Priority inheritance: a merged input of a higher class moves the rest of the turn
        to that class's queue and priority key, and upgrades its admission lease."""
        if klass >= self.klass:
            return
        await workflow.execute_local_activity(
            names.ACT_UPGRADE_LEASE, UpgradeLease(turn.turn_id, klass),
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        self.klass = klass

    async def _step_or_suspend(self, turn: TurnInput, step: int, ctx: ConversationContext,
                               messages: list[ChatMessage]) -> LlmStepOutput | str:  # fmt: skip
        """The step. Refused by the budget, or failing for a reason that may clear (billing,
        auth, an outage past the step's budget), the turn suspends or parks, then retries the
        step; a string says why it ends instead (stopped, retired, parked too long)."""
        while True:
            try:
                return await self._step(turn, step, ctx, messages)
            except ActivityError as exc:
                why = hold_reason(exc)
                if why is None:
                    raise
                self.cause = failures.reason(exc)
            ended = await self._suspended(turn, why)
            if ended:
                return ended
            self.resumes += 1

    async def _suspend(self, turn: TurnInput, why: str, detail: str = "") -> None:
        """Give the admission slot back (the lease stays, suspended, under the turn's id)."""
        await workflow.execute_local_activity(
            names.ACT_SUSPEND, SuspendTurn(turn.turn_id, why, turn.employee, detail),
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip

    async def _suspended(self, turn: TurnInput, why: str) -> str:
        """Hold no slot until admission grants it again: "" to go on, else why the turn ends
        (an Interrupt or Stop, a retired generation, 7 days parked)."""
        await self._suspend(turn, why, self.cause)
        return await self._readmit(turn, why)

    async def _readmit(self, turn: TurnInput, why: str, *, ask_first: bool = False) -> str:
        """Ask admission until it grants the slot again (at once when `ask_first`, else after
        a wake): "" to go on, else why the turn ends."""
        parked = why.startswith(names.PARKED)
        ask = AdmitRequest(turn.employee, turn.generation, turn.agent, turn.thread, turn.stream_key,
                           self.klass, workflow_id=turn.turn_id, turn_id=turn.turn_id)  # fmt: skip
        while True:
            # A park probes every 15 minutes (the provider may be back, the key changed).
            if not ask_first:
                await self._nudged(self.nudges, PARK_PROBE if parked else SUSPENDED_RECHECK)
            ask_first = False
            if self.stop_reason is not None:
                return names.TURN_INTERRUPTED
            grant = await workflow.execute_local_activity(
                names.ACT_ADMIT, ask, result_type=Admission,
                start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
            )  # fmt: skip
            if grant.granted:
                return ""
            if grant.gate == names.GEN_RETIRED:
                return names.TURN_INTERRUPTED
            if grant.gate == names.GATE_PARKED_TOO_LONG:  # since its first park, by the database
                return f"{grant.reason} ({why})" + (f": {self.cause}" if self.cause else "")

    async def _nudged(self, seen: int, timeout: timedelta) -> None:
        """Until a `released` or `wake` Signal, a stop, or the re-check deadline."""
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: self.nudges != seen or self.stop_reason is not None, timeout=timeout
            )

    async def _step(self, turn: TurnInput, step: int, ctx: ConversationContext,
                    messages: list[ChatMessage]) -> LlmStepOutput:  # fmt: skip
        queue = workflow.info().task_queue
        # A step retried after a suspension gets its own id: ids feed the spend keys.
        again = f"-r{self.resumes}" if self.resumes else ""
        out: LlmStepOutput = await workflow.execute_activity(
            names.ACT_LLM_STEP,
            LlmStepInput(turn.employee, turn.turn_id, step, self.klass, ctx.model, messages,
                         ctx.tools, transcript=ctx.stored),
            result_type=LlmStepOutput,
            task_queue=names.queue_for(names.LLM_QUEUES[self.klass], queue),
            priority=Priority(priority_key=self.klass, fairness_key=turn.employee),
            activity_id=f"{turn.turn_id}:step-{step}{again}",
            start_to_close_timeout=policies.LLM_ATTEMPT_TIMEOUT,
            schedule_to_close_timeout=(
                policies.LLM_STEP_BUDGET_LOCAL if ctx.model.is_local() else policies.LLM_STEP_BUDGET
            ),
            heartbeat_timeout=timedelta(seconds=turn.llm_heartbeat_s),
            retry_policy=policies.LLM_RETRY,
            # A cancelled turn waits for the provider call to stop (it heartbeats).
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )  # fmt: skip
        return out

    async def _read(self, turn: TurnInput, items: list[DeliveryItem]) -> list[ChatMessage]:
        """Inputs as the model reads them; an owner's Retry of an unknown call runs the call
        again first (under a new id, the same `unknown` rule) and says what it returned."""
        out: list[ChatMessage] = []
        for item in items:
            data = (item.payload or {}).get("data") or {}
            if item.type != names.TYPE_TOOL_RETRY or not isinstance(data, dict):
                out.append(user_message(item, workflow.now()))
                continue
            call = ToolCall(f"retry-{item.ingress_id}", str(data.get("name")),
                            json.dumps(data.get("arguments") or {}))  # fmt: skip
            (result,) = await self._tools(turn, [call], [item], retry_of=data.get("retry_of"))
            out.append(ChatMessage("user", f"[the owner asked to run your {call.name} call "
                                           f"{data.get('retry_of')} again; it returned: "
                                           f"{result.content}]"))  # fmt: skip
        return out

    async def _tools(self, turn: TurnInput, calls: list[ToolCall], consumed: list[DeliveryItem],
                     retry_of: str | None = None) -> list[ChatMessage]:  # fmt: skip
        """The whole batch, in order, each call an activity with an id from (turn, call);
        a call that failed for good is told to the model as such. With the generation's flag
        `concurrent_read_only_tools` a batch of read-only calls runs at once (_tools_at_once)."""
        woke = (*causal(consumed), sorted({i.type for i in consumed}), task_ids(consumed))
        if (retry_of is None and turn.flags.get(names.FLAG_CONCURRENT_READ_ONLY_TOOLS)
                and len(calls) > 1 and all(self._read_only(c) for c in calls)
                and workflow.patched(PATCH_READ_ONLY_BATCH)):  # fmt: skip
            return await self._tools_at_once(turn, calls, woke)
        out: list[ChatMessage] = []
        for call in calls:
            if (
                len(call.arguments.encode()) > names.TOOL_ARGUMENTS_MAX_BYTES
            ):  # I7: not into Temporal
                text = json.dumps(
                    {"error": f"arguments over {names.TOOL_ARGUMENTS_MAX_BYTES} bytes"}
                )
                out.append(tool_message(call, ToolResult(text, names.TOOL_REFUSED)))
                continue
            if (retry_of is None and call.name in self.approve_tools
                    and workflow.patched(PATCH_TOOL_APPROVALS)):  # fmt: skip
                verdict = await self._tool_approved(turn, call)
                if self.stop_reason is not None:
                    return out  # stopped while the owner decided: the turn ends unsaved
                if verdict != names.APPROVAL_APPROVED:
                    text = json.dumps({"error": f"this call needed the owner's approval and "
                                                f"was {verdict}; it was not made"})  # fmt: skip
                    out.append(tool_message(call, ToolResult(text, names.TOOL_REFUSED)))
                    continue
            out.append(await self._call(turn, call, woke, retry_of))
        return out

    def _read_only(self, call: ToolCall) -> bool:
        """A call that may run beside others: read-only by the registry, within its bound,
        and waiting for no approval."""
        return (
            len(call.arguments.encode()) <= names.TOOL_ARGUMENTS_MAX_BYTES
            and call.name not in self.approve_tools
            and tool_registry.read_only(call.name, call.arguments)
        )

    async def _tools_at_once(self, turn: TurnInput, calls: list[ToolCall],
                             woke: Woke) -> list[ChatMessage]:  # fmt: skip
        """RFC-0006 §6.3: a batch of read-only calls starts together, at most 8 at once (the
        next starts as one ends); the results are appended in call order, whatever order they
        came in (asyncio.gather keeps it; the semaphore wakes its waiters in order, so the
        commands replay the same)."""
        gate = asyncio.Semaphore(names.READ_ONLY_BATCH_MAX_AT_ONCE)

        async def one(call: ToolCall) -> ChatMessage:
            async with gate:
                return await self._call(turn, call, woke, None)

        return list(await asyncio.gather(*(one(c) for c in calls)))

    async def _call(self, turn: TurnInput, call: ToolCall, woke: Woke,
                    retry_of: str | None) -> ChatMessage:  # fmt: skip
        """One call as an activity; a call that failed for good becomes an error message."""
        chain, hop, path, woken_by, woken_tasks = woke
        req = ToolCallInput(
            turn.employee, turn.generation, turn.agent, turn.thread,
            names.lane_of(turn.stream_key), turn.stream_key, turn.turn_id, call.id,
            call.name, call.arguments, self.klass, dict(turn.route), chain, hop, path,
            woken_by, retry_of, woken_tasks,
        )  # fmt: skip
        try:
            result = await workflow.execute_activity(
                names.ACT_TOOL, req, result_type=ToolResult,
                activity_id=f"{turn.turn_id}:tool-{call.id}",
                priority=Priority(priority_key=self.klass, fairness_key=turn.employee),
                start_to_close_timeout=policies.TOOL_ATTEMPT_TIMEOUT,
                schedule_to_close_timeout=policies.TOOL_BUDGET,
                heartbeat_timeout=policies.TOOL_HEARTBEAT, retry_policy=policies.TOOL_RETRY,
            )  # fmt: skip
        except ActivityError as exc:
            text = json.dumps({"error": f"the tool failed: {tool_failure_reason(exc)}"})
            result = ToolResult(text, names.TOOL_FAILED)
            if workflow.patched(PATCH_TOOL_FAILED):  # the operator reads why
                failed = ToolFailed(turn.turn_id, call.id, call.name, failures.reason(exc))
                await self._tool_failed(failed)
        return tool_message(call, result)

    async def _tool_failed(self, failed: ToolFailed) -> None:
        await workflow.execute_local_activity(
            names.ACT_TOOL_FAILED, failed, activity_id=f"{failed.turn_id}:failed-{failed.call_id}",
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip

    async def _save(self, req: SaveTurn) -> Saved:
        """The consuming save; a cancel meanwhile lets it finish (and tells the entity first,
        when the turn is to: `tell_consumed`)."""
        save = workflow.start_local_activity(
            names.ACT_SAVE, req, result_type=Saved, activity_id=f"{req.turn.turn_id}:save",
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        try:
            return await asyncio.shield(save)
        except asyncio.CancelledError:
            await save  # raises if the save failed: then nothing was consumed
            await self._tell_consumed(req)
            raise

    async def _tell_consumed(self, req: SaveTurn) -> None:
        """`inputs_consumed`, for an entity that learns it no other way (`tell_consumed`: it
        began before the patch `consumed-from-database`)."""
        parent = workflow.info().parent
        if parent is None or not req.turn.tell_consumed:
            return
        entity = workflow.get_external_workflow_handle(parent.workflow_id)
        await entity.signal(names.SIGNAL_INPUTS_CONSUMED,
                            InputsConsumed(req.turn.turn_id, req.consumed_seqs))  # fmt: skip

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnResult:
        ctx = await workflow.execute_local_activity(
            names.ACT_LOAD, turn, result_type=ConversationContext,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
            activity_id=f"{turn.turn_id}:load",
        )  # fmt: skip
        self.approve_tools = list(ctx.approve_tools)
        b2 = turn.route.get("kind") in names.CHANNEL_KINDS
        consumed = list(turn.inputs)
        new = await self._read(turn, list(turn.inputs))
        reply: str | None = None
        for step in range(names.TURN_MAX_STEPS):
            if self.stop_reason is not None:  # a merge point: nothing is saved
                return TurnResult(turn.turn_id, names.TURN_INTERRUPTED, [], None)
            if self.offered:  # merge point B1: before the next model call
                merged, self.offered = self.offered, []
                self.merged += len(merged)
                consumed += merged
                new += await self._read(turn, merged)
                await self._merged(turn, step, merged)
                await self._inherit(turn, min(i.klass for i in merged))
            # The stored transcript stays out of the payload: the step reads it by version
            # (`ctx.stored`); a run loaded before that carries it inline (`ctx.transcript`).
            system = [ChatMessage("system", ctx.system)] if ctx.system else []
            messages = bounded_transcript(system + ctx.transcript + new)
            out = await self._step_or_suspend(turn, step, ctx, messages)
            if out == names.TURN_INTERRUPTED:  # stopped while suspended: nothing is saved
                return TurnResult(turn.turn_id, names.TURN_INTERRUPTED, [], None)
            if isinstance(out, str):  # parked too long: the entity dead-letters the inputs
                return TurnResult(turn.turn_id, names.TURN_FAILED, [], None, dead_letter=out)
            new.append(out.message)
            if out.message.tool_calls:  # the whole batch is answered before the next step
                if workflow.patched(PATCH_TOOLS):
                    new += await self._tools(turn, out.message.tool_calls, consumed)
                else:  # a run that started before tools existed answers as it did then
                    new += [tool_unavailable(c) for c in out.message.tool_calls]
                continue
            if b2 and self.offered and self.drafts < names.TURN_MAX_B2:
                self.drafts += 1  # merge point B2: the draft stays, one more step
                new.append(b2_note(len(self.offered)))
                continue
            reply = out.message.content
            break
        seqs = sorted(i.seq for i in consumed)
        req = SaveTurn(turn, new, seqs, [i.ingress_id for i in consumed], reply)
        saved = await self._save(req)
        told = asyncio.ensure_future(self._tell_consumed(req))
        if saved.outbound_id is None:
            await told
        elif saved.approval_id is not None:
            await told
            if await self._approved(turn, saved.approval_id):
                await self._send(turn, saved)
        elif saved.kind == names.KIND_CHAT and workflow.patched(PATCH_LOCAL_CHAT_SEND):
            # Owner chat's "provider" is our own table: a short database step, sent in the
            # workflow task that saved, and the turn closes in that task too (its result names
            # the consumed inputs).
            try:
                await workflow.execute_local_activity(
                    names.ACT_SEND, saved.outbound_id, result_type=str,
                    activity_id=f"{turn.turn_id}:send",
                    start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.SEND_RETRY,
                )  # fmt: skip
            except BaseException:
                await told  # a failed turn's entity must know first what the save consumed
                raise
        else:
            await self._send(turn, saved)
            await told
        return TurnResult(turn.turn_id, names.TURN_DONE, seqs, saved.outbound_id)

    async def _send(self, turn: TurnInput, saved: Saved) -> None:
        """SPEC §11: on queue `egress`, priority the class, fairness key the account."""
        await workflow.execute_activity(
            names.ACT_SEND, saved.outbound_id, result_type=str,
            task_queue=names.queue_for(names.EGRESS_QUEUE, workflow.info().task_queue),
            activity_id=f"{turn.turn_id}:send",
            start_to_close_timeout=timedelta(seconds=turn.send_timeout_s),
            retry_policy=policies.SEND_RETRY,
            priority=Priority(priority_key=turn.klass,
                              fairness_key=saved.account or turn.employee),
        )  # fmt: skip

    async def _approved(self, turn: TurnInput, approval_id: str) -> bool:
        """Wait for the owner's decision on a held send with no slot held; True when it is
        approved and this turn took the decision."""
        await self._suspend(turn, names.APPROVAL_HELD)
        return await self._decision(turn, approval_id) == names.APPROVAL_APPROVED

    async def _tool_approved(self, turn: TurnInput, call: ToolCall) -> str:
        """Wait for the owner's decision on a tool call with no slot held, then take the
        slot back: the decision (`approved`, `declined`, `expired`), or `stopped`."""
        hold = HoldToolCall(turn.employee, turn.generation, turn.stream_key, turn.turn_id,
                            call.id, call.name, call.arguments, dict(turn.route))  # fmt: skip
        approval_id = await workflow.execute_local_activity(
            names.ACT_APPROVAL_HOLD_TOOL, hold, result_type=str,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        await self._suspend(turn, names.APPROVAL_HELD)
        state = await self._decision(turn, approval_id)
        if state is None or await self._readmit(turn, names.APPROVAL_HELD, ask_first=True):
            return "stopped"
        return state

    async def _decision(self, turn: TurnInput, approval_id: str) -> str | None:
        """The decision this turn took, once made (None: stopped first, or taken already).
        A Stop ends the wait: the ApprovalWorkflow lives on (abandoned), and the watchdog
        takes its decision once the generation runs again."""
        child = await workflow.start_child_workflow(
            names.WF_APPROVAL, approval_id, id=f"approval-{approval_id}",
            task_queue=workflow.info().task_queue,
            parent_close_policy=ParentClosePolicy.ABANDON,
            cancellation_type=ChildWorkflowCancellationType.ABANDON,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            priority=Priority(priority_key=names.C1_OWNER, fairness_key=turn.employee),
        )  # fmt: skip
        await workflow.wait_condition(lambda: child.done() or self.stop_reason is not None)
        if not child.done():
            return None
        state = await workflow.execute_local_activity(
            names.ACT_APPROVAL_TAKE, approval_id, result_type=str,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        return None if state is None else str(state)
