"""ConversationWorkflow, the entity of one stream (SPEC §7, §8).

This release: it takes `deliver` batches from the relay, drops every input it already applied
(`seq <= applied_seq`, seeded from the stream cursor on every start), keeps the rest pending in
seq order, answers the `status` Query, and passivates after idle with nothing pending.
Admission, turns, merging and consumption come with the TurnWorkflow.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from eventos import names
    from eventos.contracts import DeliverBatch, DeliveryItem, EntityStatus, StreamCursor

# Passivation after idle (SPEC §7): owner 24 h, customer 30 min, others 10 min.
IDLE_BY_LANE = {
    names.LANE_TALK: timedelta(hours=24),
    names.LANE_CUSTOMER: timedelta(minutes=30),
    names.LANE_WORKER: timedelta(minutes=10),
}


@workflow.defn(name=names.WF_CONVERSATION)
class ConversationWorkflow:
    """One conversation's inbox: inputs in seq order, each applied once."""

    @workflow.init
    def __init__(self, cursor: StreamCursor) -> None:
        self.cursor = cursor
        self.applied_seq = cursor.applied_seq
        self.pending: list[DeliveryItem] = []
        self.received = 0
        self.dropped = 0
        self.signals = 0
        self.last_activity = workflow.now()

    @workflow.signal(name=names.SIGNAL_DELIVER)
    def deliver(self, batch: DeliverBatch) -> None:
        """Buffer only (a Signal is a hint, the database is the truth)."""
        self.signals += 1
        self.last_activity = workflow.now()
        for item in batch.items:
            if item.seq <= self.applied_seq:
                self.dropped += 1  # a repeat after a relay crash between accept and commit
                continue
            self.pending.append(item)
            self.applied_seq = item.seq
            self.received += 1

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

    def _idle_deadline(self) -> timedelta:
        idle = IDLE_BY_LANE.get(self.cursor.lane, IDLE_BY_LANE[names.LANE_WORKER])
        return self.last_activity + idle - workflow.now()

    async def _wait_for_signal(self, timeout: timedelta) -> None:
        """Until the next Signal or the deadline (one timer, never ≤ 0 or sub-second)."""
        seen = self.signals
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: self.signals != seen, timeout=timeout)

    @workflow.run
    async def run(self, cursor: StreamCursor) -> EntityStatus:
        while True:
            remaining = self._idle_deadline()
            if remaining >= timedelta(seconds=1):
                await self._wait_for_signal(remaining)
                continue
            if self.pending:
                # Inputs wait for their turn; an entity never closes over unconsumed input.
                self.last_activity = workflow.now()
                continue
            before = self.signals
            await workflow.wait_condition(workflow.all_handlers_finished)
            # No await between this check and the return: a late deliver keeps us open.
            if self.signals == before and not self.pending:
                return self.status()
