"""ConversationWorkflow, the entity of one stream (SPEC §7, §8).

It takes `deliver` batches from the relay and drops every input it already applied
(`seq <= applied_seq`, seeded from the stream cursor on every start). With input pending and
no turn running it asks admission for a slot (refused, it asks again on `wake`, on an input of
a higher class or on its timer, not on every Signal), then runs a TurnWorkflow child over the top
class's oldest input and the inputs after it on the same reply route (lower classes wait;
≤ 50 inputs or 256 KB). Inputs that arrive during the turn on its route are offered to it
(merge points B1/B2). What a turn consumed leaves the pending list by the turn's result; a turn
that failed or was cancelled (perhaps after its consuming save) has the pending inputs it covered
read back from the database, which keeps only the unsettled ones (an entity run from before the
patch `consumed-from-database` has its turns signal `inputs_consumed` instead). The owner's
`interrupt_turn` Update stops a lower-class turn at its next merge point; its inputs stay
pending and the higher class runs next (Stop uses it too, with every class below it). While
the generation is paused admission refuses and the entity waits for `wake`; once it is retired
the entity closes without a turn.
A thread whose turns keep failing is backed off (admission says until when) or quarantined
(its inputs are held, never dead-lettered for it, until the owner's release wakes it).
Cancelled, the entity cancels its turn and waits up to 2 minutes for it to drain. It
passivates after idle with nothing pending and no turn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import (
    ActivityError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
)
from temporalio.workflow import (
    ChildWorkflowCancellationType,
    ChildWorkflowHandle,
    ParentClosePolicy,
)

with workflow.unsafe.imports_passed_through():
    import eventos.failures as failures
    import eventos.names as names
    import eventos.workflows.policies as policies
    from eventos.contracts import (
        Admission,
        AdmitRequest,
        DeadLetter,
        DeliverBatch,
        DeliveryItem,
        EntityStatus,
        InputsConsumed,
        InterruptTurn,
        OfferInputs,
        ReleaseTurn,
        ReloadInputs,
        RunEnded,
        SkipInputs,
        StreamCursor,
        TerminateWorkflow,
        TurnInput,
        TurnResult,
    )

# Passivation after idle (SPEC §7): owner 24 h, customer 30 min, others 10 min.
IDLE_BY_LANE = {
    names.LANE_TALK: timedelta(hours=24),
    names.LANE_CUSTOMER: timedelta(minutes=30),
    names.LANE_WORKER: timedelta(minutes=10),
}
# Debounce of an idle entity (SPEC §8): (window, cap); owner chat and background none.
DEBOUNCE_BY_LANE = {names.LANE_CUSTOMER: (timedelta(seconds=2), timedelta(seconds=8))}
DEBOUNCE_GROUP = (timedelta(seconds=3), timedelta(seconds=10))  # customer groups
ADMISSION_ASK_AGAIN = timedelta(seconds=names.ADMISSION_ASK_AGAIN_S)  # or until `wake`
PAUSED_RECHECK = timedelta(minutes=10)  # paused, or held by the budget: wait for `wake`
FAILED_TURN_BACKOFF = timedelta(seconds=10)
PATCH_RUN_METRICS = "run-metrics"  # a run reports its Signals and history size as it ends
# Debounce anchors are the inputs' own times in the bus, not their arrival here: inputs that
# waited out an outage are not debounced a second time.
PATCH_DEBOUNCE_BY_AGE = "debounce-by-input-age"
# Turns no longer signal `inputs_consumed` (TurnInput.tell_consumed): after a failed or cancelled
# turn the entity reads which of the inputs it covered are still unsettled (EG7: one Signal less
# a turn, and often one entity task).
PATCH_CONSUMED_FROM_DATABASE = "consumed-from-database"
# Following a running turn sets no timer (it carried nothing: the turn's end or a Signal wakes
# the entity): one timer command and its cancel less a turn.
PATCH_FOLLOW_WITHOUT_TIMER = "follow-turn-without-timer"
# An entity admission refused asks again on `wake`, on an input of a class above the one it
# asked for, or on its timer; not on every `deliver` (admission keeps its place, and each ask
# takes the instance-wide lock: under a full backlog most Signals reach a waiting entity).
PATCH_ASK_ON_WAKE = "ask-again-on-wake"
# An entity's asks say it takes what the relay held for it while it waited (`holds`): the relay
# sends it no input of its class or below meanwhile (each a Signal and a workflow task), and the
# grant of its next ask (`take_after`) hands them over (eventos.delivery.held).
PATCH_TAKE_HELD = "take-held-on-grant"
RUN_ROLLED, RUN_CLOSED = "rolled", "closed"
FAILURE_MAX = 500  # characters of a failed turn's cause (turns.error, the dead letter)


def route_key(item: DeliveryItem) -> tuple[object, ...]:
    return (item.route.get("agent"), item.route.get("kind"), item.route.get("session"),
            item.route.get("trigger"))  # fmt: skip


def next_inputs(pending: list[DeliveryItem]) -> list[DeliveryItem]:
    """The top class's oldest input, then the inputs after it on its route up to the first
    input of another route of that class (lower classes are passed over, they wait), within
    50 inputs and 256 KB. FIFO holds per route: a route has one class."""
    if not pending:
        return []
    top = min(i.klass for i in pending)
    head = next(i for i in pending if i.klass == top)
    return run_after(pending, head, head.seq - 1)


def run_after(pending: list[DeliveryItem], head: DeliveryItem, after: int,
              size: int = 0, count: int = 0) -> list[DeliveryItem]:  # fmt: skip
    """Inputs with seq > `after` on `head`'s route, skipping lower classes, stopping at another
    route of the same or a higher class or at the turn bounds (counting `size`, `count`)."""
    out: list[DeliveryItem] = []
    for item in pending:
        if item.seq <= after or item.klass > head.klass:
            continue
        if (
            route_key(item) != route_key(head)
            or count + len(out) >= names.TURN_MAX_INPUTS
            or size + item.size > names.TURN_MAX_BYTES
        ):
            break
        out.append(item)
        size += item.size
    return out


def failure_reason(exc: BaseException) -> str:
    """Why a turn failed, by its innermost cause (not the outer "Activity task failed"):
    `<category>: <Type>: <message>`, redacted and bounded (eventos.failures)."""
    return failures.reason(exc, FAILURE_MAX)


@workflow.defn(name=names.WF_CONVERSATION)
class ConversationWorkflow:
    """One conversation: inputs in seq order, each applied once, one turn at a time."""

    @workflow.init
    def __init__(self, cursor: StreamCursor) -> None:
        self.cursor = cursor
        self.applied_seq = cursor.applied_seq
        self.pending: list[DeliveryItem] = []
        self.received = 0
        self.dropped = 0
        self.signals = 0
        self.wakes = 0
        self.last_activity = workflow.now()
        self.first_pending_at = workflow.now()
        self.born: dict[int, datetime] = {}  # when each pending input entered the bus
        self.after_turn = False  # inputs left over by a turn start the next one at once
        # Failed turns by their first input's seq (carried across continue-as-new).
        self.failures: dict[int, int] = {seq: n for seq, n in cursor.failures}
        self.turn: ChildWorkflowHandle[object, TurnResult] | None = None
        self.turn_inputs: list[DeliveryItem] = []
        self.turn_bytes = 0
        self.turn_count = 0
        self.offered_through = 0
        self.asks = 0  # admission asks of this run: each ask's key repeats on a replay
        self.asked_class = names.C4_BACKGROUND  # the class of the last ask
        self.queued = False  # the last ask (with `holds`) was queued: the relay holds our inputs
        self.interrupted: str | None = None  # the turn an Update is stopping
        self.retired = False  # admission said the generation is retired: close now
        self.slot_of: str | None = None  # the turn whose admission slot we hold until released
        self.backoff_left = timedelta(0)  # admission's `backoff` refusal: ask again after this

    @workflow.signal(name=names.SIGNAL_DELIVER)
    def deliver(self, batch: DeliverBatch) -> None:
        """Buffer only (a Signal is a hint, the database is the truth)."""
        self.signals += 1
        self._buffer(batch.items)

    def _buffer(self, items: list[DeliveryItem]) -> None:
        """Inputs from a `deliver` Signal or an admission grant, each applied once."""
        self.last_activity = workflow.now()
        if not self.pending:
            self.first_pending_at = self.last_activity
            self.after_turn = False
        for item in items:
            if item.seq <= self.applied_seq:
                # A repeat after a relay crash between accept and commit, or a Signal's input
                # a grant handed over first.
                self.dropped += 1
                continue
            self.pending.append(item)
            self.applied_seq = item.seq
            self.received += 1
            if item.waited_s is not None:
                self.born[item.seq] = self.last_activity - timedelta(seconds=item.waited_s)
        if len(self.born) > len(self.pending):  # forget the consumed ones
            keep = {i.seq for i in self.pending}
            self.born = {s: t for s, t in self.born.items() if s in keep}

    @workflow.signal(name=names.SIGNAL_WAKE)
    def wake(self) -> None:
        """Admission has room again."""
        self.wakes += 1

    @workflow.signal(name=names.SIGNAL_INPUTS_CONSUMED)
    def inputs_consumed(self, msg: InputsConsumed) -> None:
        """The running turn's consuming save committed: those inputs are gone for good (sent
        only by the turns of runs from before the patch `consumed-from-database`)."""
        done = set(msg.seqs)
        self.pending = [i for i in self.pending if i.seq not in done]

    @workflow.update(name=names.UPDATE_INTERRUPT)
    async def interrupt_turn(self, req: InterruptTurn) -> str:
        """Stop the running turn at its next merge point; its inputs stay pending."""
        assert self.turn is not None
        self.interrupted = req.turn_id
        # If the turn closed meanwhile there is nothing left to stop.
        with contextlib.suppress(FailureError):
            await self.turn.signal(names.SIGNAL_STOP_AT_MERGE, req.reason)
        return names.TURN_INTERRUPTED

    @interrupt_turn.validator
    def _check_interrupt(self, req: InterruptTurn) -> None:
        """Only a running turn of a lower class than the interrupter's (no history written)."""
        if self.turn is None or self.turn.done() or self.turn.id != req.turn_id:
            raise ValueError(f"turn {req.turn_id!r} is not running on this conversation")
        klass = min(i.klass for i in self.turn_inputs)
        if klass <= req.by_class:
            raise ValueError(f"turn {req.turn_id!r} is class C{klass}, not below C{req.by_class}")
        if self.interrupted == req.turn_id:
            raise ValueError(f"turn {req.turn_id!r} is already stopping")

    @workflow.query(name=names.QUERY_STATUS)
    def status(self) -> EntityStatus:
        running = self.turn is not None and not self.turn.done()
        return EntityStatus(
            stream_key=self.cursor.stream_key,
            applied_seq=self.applied_seq,
            pending=len(self.pending),
            received=self.received,
            dropped=self.dropped,
            signals=self.signals,
            turn_id=self.turn.id if running and self.turn else None,
            turn_class=min(i.klass for i in self.turn_inputs) if running else None,
            slot_of=self.slot_of,
        )

    def _offerable(self) -> list[DeliveryItem]:
        """Pending inputs after those offered so far, on the turn's route (merge point B1);
        a trigger's ticks merge only with `on_busy: merge`."""
        if not self.turn_inputs or self.interrupted is not None:
            return []
        if self.turn_inputs[0].route.get("on_busy", names.ON_BUSY_MERGE) != names.ON_BUSY_MERGE:
            return []
        return run_after(self.pending, self.turn_inputs[0], self.offered_through,
                         self.turn_bytes, self.turn_count)  # fmt: skip

    async def _until(self, done: Callable[[], bool], timeout: timedelta | None) -> None:
        """Until `done()` or the deadline (None: no deadline); one timer, never sub-second."""
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                done, timeout=None if timeout is None else max(timeout, timedelta(seconds=1))
            )

    async def _wait(self, timeout: timedelta | None, *, turn_done: bool = False) -> None:
        """Until a Signal (or the turn ends), or the deadline."""
        seen = (self.signals, self.wakes)
        await self._until(
            lambda: (
                (self.signals, self.wakes) != seen
                or (turn_done and self.turn is not None and self.turn.done())
            ),
            timeout,
        )

    async def _wait_refused(self, timeout: timedelta) -> None:
        """After admission refused: until `wake`, an input of a class above the one asked for,
        a due roll, or the deadline. Other inputs only join the pending list (runs from
        before the patch `ask-again-on-wake` end the wait on every Signal)."""
        if not workflow.patched(PATCH_ASK_ON_WAKE):
            await self._wait(timeout)
            return
        wakes = self.wakes
        await self._until(
            lambda: (
                self.wakes != wakes
                or min((i.klass for i in self.pending), default=self.asked_class) < self.asked_class
                or self._should_roll()
            ),
            timeout,
        )

    async def _start_turn(self) -> str:
        """Admit and start the next turn: "" when it started, else why not (a gate, or
        "queued": admission wakes us when a slot is ours)."""
        inputs = next_inputs(self.pending)
        first = inputs[0]
        c = self.cursor
        self.asks += 1
        info = workflow.info()
        holds = workflow.patched(PATCH_TAKE_HELD)  # the relay holds our inputs while we wait
        req = AdmitRequest(c.employee, c.generation, str(first.route.get("agent")), c.thread,
                           c.stream_key, min(i.klass for i in inputs),
                           workflow_id=info.workflow_id, ask=f"{info.run_id}:{self.asks}",
                           holds=holds,
                           take_after=self.applied_seq if self.queued else None)  # fmt: skip
        self.asked_class = req.klass
        grant = await workflow.execute_local_activity(
            names.ACT_ADMIT, req, result_type=Admission,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        self.queued = holds and not grant.granted and not grant.gate
        if not grant.granted:
            self.backoff_left = timedelta(seconds=grant.retry_after_s)
            return grant.gate or "queued"
        if grant.inputs:  # held for us while we waited: those on the turn's route join it
            self._buffer(grant.inputs)
            inputs = run_after(self.pending, first, first.seq - 1)
        self.slot_of = grant.turn_id
        told = not workflow.patched(PATCH_CONSUMED_FROM_DATABASE)  # the turn signals (old runs)
        turn = TurnInput(grant.turn_id, c.employee, c.generation, req.agent, c.thread,
                         c.stream_key, req.klass, dict(first.route), inputs, flags=dict(c.flags),
                         tell_consumed=told, send_timeout_s=c.send_timeout_s,
                         llm_heartbeat_s=c.llm_heartbeat_s)  # fmt: skip
        self.turn = await workflow.start_child_workflow(
            names.WF_TURN, turn, id=grant.turn_id, result_type=TurnResult,
            task_queue=c.turn_queue or workflow.info().task_queue,
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            cancellation_type=ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )  # fmt: skip
        self.turn_inputs = inputs
        self.turn_bytes = sum(i.size for i in inputs)
        self.turn_count = len(inputs)
        self.offered_through = inputs[-1].seq
        return ""

    async def _skip_busy(self) -> bool:
        """Settle ticks of the running turn's trigger that arrived meanwhile (`on_busy: skip`)."""
        assert self.turn is not None
        head, taken = self.turn_inputs[0], {i.seq for i in self.turn_inputs}
        skip = [i for i in self.pending
                if i.seq not in taken and route_key(i) == route_key(head)
                and i.route.get("on_busy") == names.ON_BUSY_SKIP]  # fmt: skip
        if not skip:
            return False
        reason = f"skipped: {head.route.get('trigger')} was running (turn {self.turn.id})"
        req = SkipInputs(self.cursor.stream_key, [i.seq for i in skip], reason)
        await workflow.execute_local_activity(
            names.ACT_SKIP_INPUTS, req,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        gone = {i.seq for i in skip}
        self.pending = [i for i in self.pending if i.seq not in gone]
        return True

    async def _follow_turn(self) -> None:
        assert self.turn is not None
        if not self.turn.done() and await self._skip_busy():
            return
        offer = [] if self.turn.done() else self._offerable()
        if offer:
            self.offered_through = offer[-1].seq
            self.turn_count += len(offer)  # offered inputs count toward the turn's bounds
            self.turn_bytes += sum(i.size for i in offer)
            # If the turn closed meanwhile, these inputs simply start the next turn.
            with contextlib.suppress(FailureError):
                await self.turn.signal(names.SIGNAL_OFFER, OfferInputs(offer))
            return
        if not self.turn.done():
            patched = workflow.patched(PATCH_FOLLOW_WITHOUT_TIMER)
            await self._wait(None if patched else IDLE_BY_LANE[names.LANE_TALK], turn_done=True)
            return
        turn_id, inputs = self.turn.id, self.turn_inputs
        status, error, consumed, final = names.TURN_DONE, None, [], False
        try:
            result = await self.turn
            status, consumed = result.status, result.consumed
            if result.dead_letter:  # parked too long: no second try
                error, final = result.dead_letter, True
        except ChildWorkflowError as exc:
            if isinstance(exc.cause, CancelledError):
                status = names.TURN_CANCELLED
            else:
                status, error = names.TURN_FAILED, failure_reason(exc)
        except ActivityError as exc:
            status, error = names.TURN_FAILED, failure_reason(exc)
        if status in (names.TURN_FAILED, names.TURN_CANCELLED) and workflow.patched(
            PATCH_CONSUMED_FROM_DATABASE
        ):
            await self._unsettled(inputs[0].seq - 1)
        held = await self._turn_ended(turn_id, status, error, consumed)
        if status == names.TURN_FAILED:
            left = {i.seq for i in self.pending}  # inputs a save consumed are not retried
            inputs = [i for i in inputs if i.seq in left]
            if inputs:
                await self._after_failure(turn_id, inputs, error or "failed", final=final,
                                          held=held)  # fmt: skip

    async def _unsettled(self, after: int) -> None:
        """A turn that ended without a result may have saved first: keep, of the pending inputs
        it covered (seq in (`after`, offered_through]), only those the database has unsettled."""
        req = ReloadInputs(self.cursor.stream_key, after, self.offered_through)
        items = await workflow.execute_local_activity(
            names.ACT_LOAD_INPUTS, req, result_type=list[DeliveryItem],
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        left = {i.seq for i in items}
        self.pending = [i for i in self.pending
                        if not after < i.seq <= req.through or i.seq in left]  # fmt: skip

    async def _turn_ended(self, turn_id: str, status: str, error: str | None,
                          consumed: list[int]) -> str | None:  # fmt: skip
        """Forget the turn, drop what it consumed and give its admission slot back: the hold
        a failed turn left its thread under (`quarantined`, `backoff`), else None (also from
        releases recorded before restart intensity existed)."""
        done = set(consumed)
        self.turn, self.turn_inputs, self.interrupted = None, [], None
        self.pending = [i for i in self.pending if i.seq not in done]
        self.after_turn = bool(self.pending)
        held = await workflow.execute_local_activity(
            names.ACT_RELEASE, ReleaseTurn(turn_id, status, error),
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        self.slot_of = None
        self.last_activity = workflow.now()
        return held if isinstance(held, str) else None

    async def _after_failure(self, turn_id: str, inputs: list[DeliveryItem], error: str, *,
                             final: bool = False, held: str | None = None) -> None:  # fmt: skip
        """Retry a failed turn's inputs once (unless `final`); then dead-letter them so the
        stream goes on. A quarantined thread holds them instead (SPEC §12): after the release
        they get their two tries again."""
        first = inputs[0].seq
        if held == names.HOLD_QUARANTINED and not final:
            self.failures.pop(first, None)
            return  # admission refuses the thread's turns until the release (and its `wake`)
        self.failures[first] = self.failures.get(first, 0) + 1
        if self.failures[first] < names.TURN_ATTEMPTS and not final:
            await self._wait(FAILED_TURN_BACKOFF)
            return
        del self.failures[first]
        reason = error if final else f"turn_failed: {error}"
        letter = DeadLetter(self.cursor.employee, self.cursor.stream_key, turn_id,
                            [i.seq for i in inputs], [i.ingress_id for i in inputs],
                            reason)  # fmt: skip
        await workflow.execute_local_activity(
            names.ACT_DEAD_LETTER, letter,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        dead = {i.seq for i in inputs}
        self.pending = [i for i in self.pending if i.seq not in dead]
        self.after_turn = bool(self.pending)

    def _debounce_left(self) -> timedelta:
        """Time to the absolute deadline min(last + window, first + cap); zero when none."""
        route = next_inputs(self.pending)[0].route
        override = route.get("debounce")
        if self.after_turn:
            return timedelta(0)
        if isinstance(override, dict):
            window = timedelta(seconds=float(override.get("window_s", 0)))
            cap = timedelta(seconds=float(override.get("cap_s", 0)))
        elif self.cursor.lane == names.LANE_CUSTOMER and route.get("group"):
            window, cap = DEBOUNCE_GROUP
        elif self.cursor.lane in DEBOUNCE_BY_LANE:
            window, cap = DEBOUNCE_BY_LANE[self.cursor.lane]
        else:
            return timedelta(0)
        last, first = self.last_activity, self.first_pending_at
        born = [self.born[i.seq] for i in next_inputs(self.pending) if i.seq in self.born]
        if born and workflow.patched(PATCH_DEBOUNCE_BY_AGE):
            last, first = max(born), min(born)
        deadline = min(last + window, first + cap)
        return deadline - workflow.now()

    def _idle_left(self) -> timedelta:
        idle = IDLE_BY_LANE.get(self.cursor.lane, IDLE_BY_LANE[names.LANE_WORKER])
        if self.cursor.idle_s is not None:
            idle = timedelta(seconds=self.cursor.idle_s)
        return self.last_activity + idle - workflow.now()

    async def _reload(self) -> None:
        """Read back the inputs the cursor names instead of carrying (after continue-as-new, or
        when the relay started this run to replace a lost one)."""
        after = self.cursor.reload_after
        if after is None or after >= self.cursor.applied_seq:
            return
        req = ReloadInputs(self.cursor.stream_key, after, self.cursor.applied_seq)
        items = await workflow.execute_local_activity(
            names.ACT_LOAD_INPUTS, req, result_type=list[DeliveryItem],
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        self.pending = items + self.pending  # Signals meanwhile only added higher seqs

    def _should_roll(self) -> bool:
        info = workflow.info()
        limit = self.cursor.roll_after
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= limit
            or self.signals >= limit
        )

    async def _report_run(self, end: str) -> None:
        """The run's Signals and history size to the workers' metrics (runs begun before
        the patch report nothing)."""
        if not workflow.patched(PATCH_RUN_METRICS):
            return
        info = workflow.info()
        report = RunEnded(end, self.signals, info.get_current_history_size())
        await workflow.execute_local_activity(
            names.ACT_RUN_ENDED, report,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip

    def _roll(self) -> None:
        """Continue-as-new carrying cursors only (no await since the caller's last check):
        the pending inputs are read back from above the lowest one."""
        c = self.cursor
        reload_after = min(i.seq for i in self.pending) - 1 if self.pending else self.applied_seq
        pending = {i.seq for i in self.pending}
        failures = [[seq, n] for seq, n in self.failures.items() if seq in pending]
        workflow.continue_as_new(
            StreamCursor(c.stream_key, c.employee, c.generation, c.lane, c.thread,
                         self.applied_seq, reload_after=reload_after, roll_after=c.roll_after,
                         idle_s=c.idle_s, cancel_grace_s=c.cancel_grace_s, failures=failures,
                         flags=dict(c.flags), send_timeout_s=c.send_timeout_s,
                         llm_heartbeat_s=c.llm_heartbeat_s, turn_queue=c.turn_queue)
        )  # fmt: skip

    async def _drain(self) -> None:
        """Cancelled: cancel the running turn, wait up to 2 minutes for it to close, then
        terminate it (its children go with it); only then is its slot given back."""
        if self.turn is None:
            return
        turn_id = self.turn.id
        if not self.turn.done():
            self.turn.cancel()
            grace = timedelta(seconds=self.cursor.cancel_grace_s)
            try:
                await workflow.wait_condition(lambda: self.turn is None or self.turn.done(),
                                              timeout=grace)  # fmt: skip
            except TimeoutError:
                await workflow.execute_local_activity(
                    names.ACT_TERMINATE,
                    TerminateWorkflow(turn_id, "did not close within its cancellation grace"),
                    start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
                )  # fmt: skip
                await workflow.wait_condition(lambda: self.turn is None or self.turn.done())
        consumed: list[int] = []
        if self.turn is not None and not self.turn.cancelled():
            with contextlib.suppress(FailureError, asyncio.CancelledError):
                consumed = (await self.turn).consumed
        await self._turn_ended(turn_id, names.TURN_CANCELLED, "entity cancelled", consumed)

    @workflow.run
    async def run(self, cursor: StreamCursor) -> EntityStatus:
        try:
            return await self._serve()
        except asyncio.CancelledError:
            await self._drain()
            raise

    async def _serve(self) -> EntityStatus:
        await self._reload()
        while True:
            if self.turn is not None:
                await self._follow_turn()
                continue
            if self._should_roll():  # between turns only
                await self._report_run(RUN_ROLLED)
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._roll()
            if self.pending:
                debounce = self._debounce_left()
                if debounce > timedelta(0):
                    await self._wait(debounce)
                    continue
                refused = await self._start_turn()
                if refused == names.GEN_RETIRED:
                    # Reset landed after the relay's generation check: these inputs are
                    # dead(reset) in the database; close without a turn.
                    self.dropped += len(self.pending)
                    self.pending, self.retired = [], True
                elif refused in (
                    names.GEN_PAUSED,
                    names.GATE_BUDGET,
                    names.GATE_QUARANTINED,
                    names.GATE_DEGRADED,
                ):
                    # Resume, the budget's release, a thread's release or an employee's
                    # recovery wakes us.
                    await self._wait_refused(PAUSED_RECHECK)
                elif refused == names.GATE_BACKOFF:
                    # The thread's failing turns back it off.
                    await self._wait_refused(self.backoff_left)
                elif refused:
                    await self._wait_refused(ADMISSION_ASK_AGAIN)
                continue
            left = self._idle_left()
            if left >= timedelta(seconds=1) and not self.retired:
                await self._wait(left)
                continue
            await self._report_run(RUN_CLOSED)  # a Signal after it keeps the run open: rare
            before = self.signals
            await workflow.wait_condition(workflow.all_handlers_finished)
            # No await between this check and the return: a late deliver keeps us open.
            if self.signals == before and not self.pending and self.turn is None:
                return self.status()
