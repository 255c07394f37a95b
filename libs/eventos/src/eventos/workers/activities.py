"""Database-bound activities (workers-workflow and egress), methods of classes that hold the pool.

Domain errors become non-retryable ApplicationErrors here, once; database outages stay
retryable. A record the database refuses (a data or integrity error: the record's own fault,
eventos.db.is_record_error) is tried RECORD_ERROR_ATTEMPTS times in all, then fails for good
with its reason (its SQLSTATE, never the database's text), so the turn fails instead of
retrying a save without limit.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError, RPCStatusCode

from eventos import names
from eventos.contracts import (
    Admission,
    AdmitRequest,
    ApprovalView,
    ConversationContext,
    DeadLetter,
    DeliveryItem,
    HoldToolCall,
    ReleaseTurn,
    ReloadInputs,
    RunEnded,
    RunEvent,
    Saved,
    SaveTurn,
    SkipInputs,
    SuspendTurn,
    TerminateWorkflow,
    ToolFailed,
    TurnInput,
    UpgradeLease,
)
from eventos.conversations import turns
from eventos.db import Conn, translate
from eventos.delivery import held
from eventos.errors import Conflict, NotFound, RecordInvalid
from eventos.health import intensity
from eventos.outbox import approvals
from eventos.outbox.egress import Egress, SendWait
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.metrics import RUN_HISTORY_BYTES, RUN_SIGNALS
from eventos.runtime.temporal import wake_entities
from eventos.scheduling import admission
from eventos.scheduling.policy import SchedConfig
from eventos.settings import SupervisionSettings
from eventos.timeline import writes as timeline

T = TypeVar("T")
log = logging.getLogger(__name__)
# Attempts of a database activity whose record the database refuses: a race (a unique
# violation a concurrent writer caused) may pass on a second try; a bad record never does.
RECORD_ERROR_ATTEMPTS = 3


def record_refused(exc: RecordInvalid) -> ApplicationError:
    """A refused record's failure: retryable until RECORD_ERROR_ATTEMPTS, then final."""
    info = activity.info()
    final = info.attempt >= RECORD_ERROR_ATTEMPTS
    log.warning("%s: the database refused a record (%s), attempt %d of %d", info.activity_type,
                exc, info.attempt, RECORD_ERROR_ATTEMPTS)  # fmt: skip
    return ApplicationError(f"the database refused a record: {exc}", type=names.RECORD_REFUSED,
                            non_retryable=final)  # fmt: skip


class DbActivities:
    """Activities that need only the database (and the keys sealing outbox recipients)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        sched: SchedConfig | None = None,
        *,
        outbox: OutboxKeys,
        egress: Egress | None = None,
        supervision: SupervisionSettings | None = None,
    ) -> None:
        self.pool = pool
        self.sched = sched or SchedConfig()
        self.supervision = supervision or SupervisionSettings()
        self.outbox = outbox
        self.egress = egress or Egress(pool, outbox)  # owner chat only, unless given senders

    async def _run(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        try:
            async with translate(), self.pool.connection() as conn:
                return await fn(conn)
        except (Conflict, NotFound) as exc:
            raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from exc
        except RecordInvalid as exc:
            raise record_refused(exc) from None  # the driver's text stays out of the history

    @activity.defn(name=names.ACT_ADMIT)
    async def admit_turn(self, req: AdmitRequest) -> Admission:
        """A slot, or a place in the queue; entities offered a slot meanwhile are woken. A
        grant to an ask with `take_after` carries what the relay held for the entity."""
        answer = await self._run(lambda conn: admission.acquire(conn, req, self.sched))
        await wake_entities(activity.client(), answer.wake)
        granted = answer.admission
        if not granted.granted or req.take_after is None:
            return granted
        after = req.take_after
        inputs = await self._run(lambda conn: held.take(conn, req.stream_key, after))
        return dataclasses.replace(granted, inputs=inputs)

    @activity.defn(name=names.ACT_RELEASE)
    async def release_turn(self, req: ReleaseTurn) -> str | None:
        """Give the slot back and wake the entities it was offered to; a failed turn counts on
        its thread's restart intensity: the hold the thread is under now (`quarantined`,
        `backoff`) or None."""
        _, wake = await self._run(
            lambda conn: admission.release(conn, self.sched, req.turn_id, req.status, req.error)
        )
        await wake_entities(activity.client(), wake)
        if req.status != names.TURN_FAILED:
            return None
        return await self._run(
            lambda conn: intensity.record_failure(conn, req.turn_id, self.supervision)
        )

    @activity.defn(name=names.ACT_SUSPEND)
    async def suspend_turn(self, req: SuspendTurn) -> None:
        """The turn gives its slot back while it waits for the budget; waiters are woken."""
        wake = await self._run(lambda conn: admission.suspend(conn, self.sched, req))
        await wake_entities(activity.client(), wake)

    @activity.defn(name=names.ACT_UPGRADE_LEASE)
    async def upgrade_lease(self, req: UpgradeLease) -> None:
        """Priority inheritance: the turn's admission lease counts in the higher class."""
        await self._run(lambda conn: admission.upgrade(conn, req.turn_id, req.klass))

    @activity.defn(name=names.ACT_LOAD)
    async def load_conversation(self, turn: TurnInput) -> ConversationContext:
        return await self._run(lambda conn: turns.load(conn, turn))

    @activity.defn(name=names.ACT_SAVE)
    async def save_turn(self, req: SaveTurn) -> Saved:
        return await self._run(lambda conn: turns.save(conn, req, self.outbox))

    @activity.defn(name=names.ACT_DEAD_LETTER)
    async def dead_letter_inputs(self, req: DeadLetter) -> None:
        await self._run(lambda conn: turns.dead_letter(conn, req))

    @activity.defn(name=names.ACT_LOAD_INPUTS)
    async def load_inputs(self, req: ReloadInputs) -> list[DeliveryItem]:
        return await self._run(lambda conn: turns.reload_inputs(conn, req))

    @activity.defn(name=names.ACT_SKIP_INPUTS)
    async def skip_inputs(self, req: SkipInputs) -> None:
        await self._run(lambda conn: turns.skip_inputs(conn, req))

    @activity.defn(name=names.ACT_TOOL_FAILED)
    async def record_tool_failed(self, req: ToolFailed) -> None:
        """A tool call that failed for good: its timeline entry with the cause."""
        await self._run(lambda conn: timeline.tool_failed(conn, req))

    @activity.defn(name=names.ACT_RUN_EVENT)
    async def record_run_event(self, event: RunEvent) -> None:
        await self._run(lambda conn: turns.record_run_event(conn, event))

    @activity.defn(name=names.ACT_TERMINATE)
    async def terminate_workflow(self, req: TerminateWorkflow) -> None:
        """Terminate a workflow (with its children: their parent close policy) by id."""
        handle = activity.client().get_workflow_handle(req.workflow_id)
        try:
            await handle.terminate(reason=req.reason)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:  # already closed: nothing to do
                raise

    @activity.defn(name=names.ACT_RUN_ENDED)
    async def entity_run_ended(self, req: RunEnded) -> None:
        """Count an entity run's Signals and history size (no database)."""
        RUN_SIGNALS.labels(req.end).observe(req.signals)
        RUN_HISTORY_BYTES.labels(req.end).observe(req.history_bytes)

    @activity.defn(name=names.ACT_SEND)
    async def egress_send(self, outbound_id: int) -> str:
        """One send (SPEC §11); a wait ends the attempt at once with its delay (BENIGN: no
        worker slot is held while a bucket refills or a provider's retry hint passes)."""
        attempt = activity.info().start_to_close_timeout  # the turn's (TurnTimeouts.send_s)
        ttl_s = attempt.total_seconds() if attempt else float(names.SEND_CLAIM_TTL_S)
        try:
            return await self.egress.send(outbound_id, ttl_s)
        except SendWait as exc:
            raise ApplicationError(
                str(exc), type=names.SEND_WAIT, category=ApplicationErrorCategory.BENIGN,
                next_retry_delay=timedelta(seconds=max(exc.wait_s, 0.05)),
            ) from None  # fmt: skip
        except (Conflict, NotFound) as exc:
            raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from exc

    @activity.defn(name=names.ACT_APPROVAL_READ)
    async def approval_read(self, approval_id: str) -> ApprovalView:
        return await self._run(lambda conn: approvals.read(conn, approval_id))

    @activity.defn(name=names.ACT_APPROVAL_HOLD_TOOL)
    async def approval_hold_tool(self, req: HoldToolCall) -> str:
        return await self._run(lambda conn: approvals.hold_tool(conn, req))

    @activity.defn(name=names.ACT_APPROVAL_REMIND)
    async def approval_remind(self, approval_id: str) -> None:
        await self._run(lambda conn: approvals.remind(conn, approval_id))

    @activity.defn(name=names.ACT_APPROVAL_EXPIRE)
    async def approval_expire(self, approval_id: str) -> str:
        return await self._run(lambda conn: approvals.expire(conn, approval_id))

    @activity.defn(name=names.ACT_APPROVAL_TAKE)
    async def approval_take(self, approval_id: str) -> str | None:
        """Act on the decision once (the turn that waited for it); None: taken already."""
        return await self._run(lambda conn: approvals.take(conn, approval_id))

    def workflow_queue_activities(self) -> list[Callable[..., Awaitable[object]]]:
        return [
            self.admit_turn, self.release_turn, self.load_conversation, self.save_turn,
            self.dead_letter_inputs, self.load_inputs, self.record_run_event,
            self.record_tool_failed,
            self.terminate_workflow, self.skip_inputs, self.suspend_turn, self.upgrade_lease,
            self.egress_send,  # owner chat's send, as a local activity of the turn
            self.entity_run_ended, self.approval_read, self.approval_remind,
            self.approval_hold_tool, self.approval_expire, self.approval_take,
        ]  # fmt: skip

    def egress_activities(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.egress_send]
