"""ConversationWorkflow, the entity of one stream (SPEC §7, §8).

It takes `deliver` batches from the relay and drops every input it already applied
(`seq <= applied_seq`, seeded from the stream cursor on every start). With input pending and
no turn running it asks admission for a slot, then runs a TurnWorkflow child over the longest
pending prefix that shares one reply route (≤ 50 inputs or 256 KB). Inputs that arrive during
the turn on its route, right after its inputs, are offered to it (merge point B1). After the
turn, what it consumed leaves the pending list. It passivates after idle with nothing
pending and no turn.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ChildWorkflowError, FailureError
from temporalio.workflow import (
    ChildWorkflowCancellationType,
    ChildWorkflowHandle,
    ParentClosePolicy,
)

with workflow.unsafe.imports_passed_through():
    from eventos import names
    from eventos.contracts import (
        Admission,
        AdmitRequest,
        DeadLetter,
        DeliverBatch,
        DeliveryItem,
        EntityStatus,
        OfferInputs,
        ReleaseTurn,
        ReloadInputs,
        StreamCursor,
        TurnInput,
        TurnResult,
    )
    from eventos.workflows import policies

# Passivation after idle (SPEC §7): owner 24 h, customer 30 min, others 10 min.
IDLE_BY_LANE = {
    names.LANE_TALK: timedelta(hours=24),
    names.LANE_CUSTOMER: timedelta(minutes=30),
    names.LANE_WORKER: timedelta(minutes=10),
}
# Debounce of an idle entity (SPEC §8): (window, cap); owner chat and background none.
# Customer groups (3 s / 10 s) join when channel drivers tell groups apart.
DEBOUNCE_BY_LANE = {names.LANE_CUSTOMER: (timedelta(seconds=2), timedelta(seconds=8))}
ADMISSION_RETRY = timedelta(seconds=5)
FAILED_TURN_BACKOFF = timedelta(seconds=10)


def route_key(item: DeliveryItem) -> tuple[object, ...]:
    return (item.route.get("agent"), item.route.get("kind"), item.route.get("session"),
            item.route.get("trigger"))  # fmt: skip


def turn_prefix(pending: list[DeliveryItem]) -> list[DeliveryItem]:
    """The longest prefix sharing the first input's route, within 50 inputs and 256 KB."""
    prefix: list[DeliveryItem] = []
    size = 0
    for item in pending:
        if prefix and (
            route_key(item) != route_key(prefix[0])
            or len(prefix) >= names.TURN_MAX_INPUTS
            or size + item.size > names.TURN_MAX_BYTES
        ):
            break
        prefix.append(item)
        size += item.size
    return prefix


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
        self.after_turn = False  # inputs left over by a turn start the next one at once
        self.failures: dict[int, int] = {}  # failed turns by their first input's seq
        # Inputs through this seq are consumed (or dead-lettered).
        self.consumed = cursor.applied_seq if cursor.reload_after is None else cursor.reload_after
        self.turn: ChildWorkflowHandle[object, TurnResult] | None = None
        self.turn_inputs: list[DeliveryItem] = []
        self.offered_through = 0

    @workflow.signal(name=names.SIGNAL_DELIVER)
    def deliver(self, batch: DeliverBatch) -> None:
        """Buffer only (a Signal is a hint, the database is the truth)."""
        self.signals += 1
        self.last_activity = workflow.now()
        if not self.pending:
            self.first_pending_at = self.last_activity
            self.after_turn = False
        for item in batch.items:
            if item.seq <= self.applied_seq:
                self.dropped += 1  # a repeat after a relay crash between accept and commit
                continue
            self.pending.append(item)
            self.applied_seq = item.seq
            self.received += 1

    @workflow.signal(name=names.SIGNAL_WAKE)
    def wake(self) -> None:
        """Admission has room again."""
        self.wakes += 1

    @workflow.query(name=names.QUERY_STATUS)
    def status(self) -> EntityStatus:
        return EntityStatus(
            stream_key=self.cursor.stream_key,
            applied_seq=self.applied_seq,
            pending=len(self.pending),
            received=self.received,
            dropped=self.dropped,
            signals=self.signals,
        )

    def _offerable(self) -> list[DeliveryItem]:
        """Pending inputs right after the turn's, on its route (never skipping another route)."""
        if not self.turn_inputs:
            return []
        out: list[DeliveryItem] = []
        for item in self.pending:
            if item.seq <= self.offered_through:
                continue
            if route_key(item) != route_key(self.turn_inputs[0]):
                break
            out.append(item)
        return out

    async def _wait(self, timeout: timedelta, *, turn_done: bool = False) -> None:
        """Until a Signal (or the turn ends), or the deadline; one timer, never sub-second."""
        seen = (self.signals, self.wakes)
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: (
                    (self.signals, self.wakes) != seen
                    or (turn_done and self.turn is not None and self.turn.done())
                ),
                timeout=max(timeout, timedelta(seconds=1)),
            )

    async def _start_turn(self) -> bool:
        inputs = turn_prefix(self.pending)
        first = inputs[0]
        c = self.cursor
        req = AdmitRequest(c.employee, c.generation, str(first.route.get("agent")), c.thread,
                           c.stream_key, min(i.klass for i in inputs))  # fmt: skip
        grant = await workflow.execute_activity(
            names.ACT_ADMIT, req, result_type=Admission,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        if not grant.granted:
            return False
        turn = TurnInput(grant.turn_id, c.employee, c.generation, req.agent, c.thread,
                         c.stream_key, req.klass, dict(first.route), inputs)  # fmt: skip
        self.turn = await workflow.start_child_workflow(
            names.WF_TURN, turn, id=grant.turn_id, result_type=TurnResult,
            task_queue=workflow.info().task_queue,
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            cancellation_type=ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )  # fmt: skip
        self.turn_inputs = inputs
        self.offered_through = inputs[-1].seq
        return True

    async def _follow_turn(self) -> None:
        assert self.turn is not None
        offer = [] if self.turn.done() else self._offerable()
        if offer:
            self.offered_through = offer[-1].seq
            # If the turn closed meanwhile, these inputs simply start the next turn.
            with contextlib.suppress(FailureError):
                await self.turn.signal(names.SIGNAL_OFFER, OfferInputs(offer))
            return
        if not self.turn.done():
            await self._wait(IDLE_BY_LANE[names.LANE_TALK], turn_done=True)
            return
        turn_id, inputs = self.turn.id, self.turn_inputs
        status, error, through = "done", None, 0
        try:
            result = await self.turn
            through = result.consumed_through
        except (ChildWorkflowError, ActivityError) as exc:
            status, error = "failed", str(exc.cause or exc)[:500]
        self.turn, self.turn_inputs = None, []
        self.pending = [i for i in self.pending if i.seq > through]
        self.consumed = max(self.consumed, through)
        self.after_turn = bool(self.pending)
        await workflow.execute_activity(
            names.ACT_RELEASE, ReleaseTurn(turn_id, status, error),
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        self.last_activity = workflow.now()
        if status == "failed":
            await self._after_failure(turn_id, inputs, error or "failed")

    async def _after_failure(self, turn_id: str, inputs: list[DeliveryItem], error: str) -> None:
        """Retry a failed turn's inputs once; then dead-letter them so the stream goes on."""
        first = inputs[0].seq
        self.failures[first] = self.failures.get(first, 0) + 1
        if self.failures[first] < names.TURN_ATTEMPTS:
            await self._wait(FAILED_TURN_BACKOFF)
            return
        del self.failures[first]
        letter = DeadLetter(self.cursor.employee, self.cursor.stream_key, turn_id,
                            [i.seq for i in inputs], [i.ingress_id for i in inputs],
                            inputs[-1].seq, f"turn_failed: {error}")  # fmt: skip
        await workflow.execute_activity(
            names.ACT_DEAD_LETTER, letter,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        dead = {i.seq for i in inputs}
        self.pending = [i for i in self.pending if i.seq not in dead]
        self.consumed = max(self.consumed, inputs[-1].seq)
        self.after_turn = bool(self.pending)

    def _debounce_left(self) -> timedelta:
        """Time to the absolute deadline min(last + window, first + cap); zero when none."""
        override = self.pending[0].route.get("debounce")
        if self.after_turn:
            return timedelta(0)
        if isinstance(override, dict):
            window = timedelta(seconds=float(override.get("window_s", 0)))
            cap = timedelta(seconds=float(override.get("cap_s", 0)))
        elif self.cursor.lane in DEBOUNCE_BY_LANE:
            window, cap = DEBOUNCE_BY_LANE[self.cursor.lane]
        else:
            return timedelta(0)
        deadline = min(self.last_activity + window, self.first_pending_at + cap)
        return deadline - workflow.now()

    def _idle_left(self) -> timedelta:
        idle = IDLE_BY_LANE.get(self.cursor.lane, IDLE_BY_LANE[names.LANE_WORKER])
        if self.cursor.idle_s is not None:
            idle = timedelta(seconds=self.cursor.idle_s)
        return self.last_activity + idle - workflow.now()

    async def _reload(self) -> None:
        """After continue-as-new: read back the inputs carried only as a cursor."""
        after = self.cursor.reload_after
        if after is None or after >= self.cursor.applied_seq:
            return
        req = ReloadInputs(self.cursor.stream_key, after, self.cursor.applied_seq)
        items = await workflow.execute_activity(
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

    def _roll(self) -> None:
        """Continue-as-new carrying cursors only (no await since the caller's last check)."""
        c = self.cursor
        workflow.continue_as_new(
            StreamCursor(c.stream_key, c.employee, c.generation, c.lane, c.thread,
                         self.applied_seq, reload_after=self.consumed, roll_after=c.roll_after,
                         idle_s=c.idle_s)
        )  # fmt: skip

    @workflow.run
    async def run(self, cursor: StreamCursor) -> EntityStatus:
        await self._reload()
        while True:
            if self.turn is not None:
                await self._follow_turn()
                continue
            if self._should_roll():  # between turns only
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._roll()
            if self.pending:
                debounce = self._debounce_left()
                if debounce > timedelta(0):
                    await self._wait(debounce)
                    continue
                if not await self._start_turn():
                    await self._wait(ADMISSION_RETRY)
                continue
            left = self._idle_left()
            if left >= timedelta(seconds=1):
                await self._wait(left)
                continue
            before = self.signals
            await workflow.wait_condition(workflow.all_handlers_finished)
            # No await between this check and the return: a late deliver keeps us open.
            if self.signals == before and not self.pending and self.turn is None:
                return self.status()
