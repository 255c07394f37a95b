"""The intent deliverer (SPEC I2, I10), run by the relay service: it applies each owner intent
to its supervisor or entity by workflow id, with a stable Update id (`intent-<id>`) and a
deadline per attempt, until applied; intents of one employee apply in order. It also
re-arms Temporal from the database (on boot and on demand).

A supervisor is started from the database's control block. One that was lost (terminated,
failed, timed out or cancelled) is rebuilt in place (`ALLOW_DUPLICATE_FAILED_ONLY`); after 3
rebuilds within an hour it is not rebuilt again and an attention item asks for Reset.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.common import Priority, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from eventos import failures, names
from eventos.contracts import (
    Control,
    EntityStatus,
    InterruptTurn,
    SetControl,
    SetLimits,
    SupervisorInput,
    SupervisorStatus,
)
from eventos.control.supervisor import Effects
from eventos.db import Conn, translate
from eventos.db.sql import Q
from eventos.employees import drain, intents
from eventos.errors import DatabaseUnavailable
from eventos.outbox import approvals, egress
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.temporal import TemporalConnection, wake_entities
from eventos.scheduling import admission
from eventos.scheduling.policy import SchedConfig

log = logging.getLogger(__name__)
ATTEMPT_S = 15.0  # the deadline of one attempt to apply an intent
CALL_TIMEOUT = timedelta(seconds=10)  # each Temporal call of an attempt (its rpc_timeout)
REARM_S = 600.0  # a re-arm visits every live generation, turn and holding stream
CLAIM_LIMIT = 20
RETRY_MAX_S = 60.0
SUPERVISOR_KINDS = (names.INTENT_START, names.INTENT_STOP, names.INTENT_RESUME,
                    names.INTENT_RESET, names.INTENT_LIMITS)  # fmt: skip


class IntentFailed(Exception):
    """An intent that can never apply as asked (settled `failed` with this reason)."""


class SupervisorLost(IntentFailed):
    """The supervisor was lost too often to be rebuilt; the owner should Reset."""


@dataclass
class Deliverer:
    """Applies intents; one attempt per intent per pass."""

    pool: AsyncConnectionPool[Conn]
    temporal: TemporalConnection
    workflow_queue: str = names.WORKFLOW_QUEUE
    attempt_s: float = ATTEMPT_S
    sched: SchedConfig = field(default_factory=SchedConfig)
    outbox: OutboxKeys = field(kw_only=True)  # re-arm makes the sends lost turns left

    async def pass_once(self) -> int:
        """Try each employee's oldest due intent; returns how many settled."""
        settled = 0
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(Q["intents_claim"], {"limit": CLAIM_LIMIT})
            for row in await cur.fetchall():
                try:
                    deadline = REARM_S if row["kind"] == names.INTENT_REARM else self.attempt_s
                    outcome = await asyncio.wait_for(self._attempt(conn, row), deadline)
                except drain.NotYet as exc:  # by design, not a failure: no attempt counted
                    wait = {"id": row["id"], "outcome": str(exc), "delay_s": names.DRAIN_RECHECK_S}
                    await conn.execute(Q["intent_wait"], wait)
                except SupervisorLost as exc:  # its own attention item asks for Reset
                    await self._settle(conn, row, names.INTENT_FAILED, str(exc))
                    settled += 1
                except IntentFailed as exc:
                    await self._fail(conn, row, str(exc))
                    settled += 1
                except Exception as exc:  # Temporal unavailable, a deadline, or a bug: shown
                    # as the intent's outcome and retried later; never stuck silently.
                    reason = failures.reason(exc)  # its innermost cause, redacted, bounded
                    unreachable = _unreachable(exc)
                    if not unreachable and int(row["attempts"]) + 1 >= names.INTENT_ATTEMPTS_MAX:
                        # Temporal answered, with an error, every time: it will not apply.
                        tries = names.INTENT_ATTEMPTS_MAX
                        await self._fail(conn, row, f"{reason} (after {tries} attempts)")
                        settled += 1
                        continue
                    delay = min(2.0 ** int(row["attempts"]), RETRY_MAX_S)
                    retry = {"id": row["id"], "outcome": reason, "delay_s": delay}
                    await conn.execute(Q["intent_retry"], retry)
                    log.warning(
                        "intent %s (%s) not applied yet: %s", row["id"], row["kind"], reason
                    )
                    if unreachable:
                        self.temporal.client = None
                        break  # Temporal is unreachable: the rest waits for the next pass
                else:
                    await self._settle(conn, row, names.INTENT_APPLIED, outcome)
                    settled += 1
        return settled

    async def _fail(self, conn: Conn, row: dict[str, Any], cause: str) -> None:
        """Settle the intent failed, with an attention item naming its cause (SPEC §12)."""
        await self._settle(conn, row, names.INTENT_FAILED, cause)
        detail = f"{row['kind']} intent {row['id']} failed: {cause}"
        await conn.execute(Q["attention_raise"], {
            "employee": row["employee"] or names.INSTANCE_ITEMS,
            "kind": names.ATTENTION_INTENT_FAILED,
            "severity": "error", "ref": f"intent-{row['id']}", "detail": detail[:1000],
        })  # fmt: skip

    async def _settle(self, conn: Conn, row: dict[str, Any], state: str, outcome: str) -> None:
        await conn.execute(
            Q["intent_settle"], {"id": row["id"], "state": state, "outcome": outcome}
        )
        log.info(
            "intent %s (%s %s) %s: %s", row["id"], row["kind"], row["employee"], state, outcome
        )

    async def _attempt(self, conn: Conn, row: dict[str, Any]) -> str:
        """One attempt, under the caller's deadline (connecting included)."""
        return await self._apply(conn, await self.temporal.get(), row)

    async def _apply(self, conn: Conn, client: Client, row: dict[str, Any]) -> str:
        kind = row["kind"]
        if kind == names.INTENT_REARM:
            return await rearm(self.pool, client, self.workflow_queue, self.sched,
                               outbox=self.outbox)  # fmt: skip
        if kind == names.INTENT_INTERRUPT:
            return await self._interrupt(client, row)
        if kind == names.INTENT_APPROVAL:  # the decision is in its row: a nudge to read it
            if await approvals.nudge(client, str(row["payload"]["approval"])):
                return "its workflow was nudged"
            return "its workflow is not running; the approvals watchdog takes the decision"
        employee, generation = str(row["employee"]), int(row["generation"])
        if kind == names.INTENT_RESET:
            return await self._reset(conn, client, row)
        how, revision = await ensure_supervisor(conn, client, employee, generation,
                                                self.workflow_queue)  # fmt: skip
        if revision >= int(row["revision"]):  # started from a control block that has it
            outcome = f"supervisor {how} at revision {revision}"
        else:
            outcome = await self._update(client, row, how)
        if kind == names.INTENT_STOP and drain.draining(row["payload"].get("pause_reason")):
            return await self._drain(conn, row, outcome)
        return outcome

    async def _drain(self, conn: Conn, row: dict[str, Any], stopped: str) -> str:
        """A flag change's Stop is applied once the generation is drained into a new one
        (eventos.employees.drain); until its turns have stopped it waits, within a bound."""
        try:
            drained = await drain.complete(conn, str(row["employee"]), int(row["generation"]))
        except drain.NotYet as exc:
            if float(row["age_s"]) > names.DRAIN_WAIT_MAX_S:
                raise IntentFailed(
                    f"{exc}: gave up after {names.DRAIN_WAIT_MAX_S} s; the "
                    "generation stays paused (Resume or Reset it)"
                ) from exc
            raise
        if drained is None:
            return f"{stopped}; nothing to drain (reset, resumed or drained meanwhile)"
        return drained.outcome()

    async def _update(self, client: Client, row: dict[str, Any], started: str) -> str:
        """Send the intent's Update unless the supervisor already has its revision."""
        handle = client.get_workflow_handle(names.supervisor_id(row["employee"], row["generation"]))
        status: SupervisorStatus = await handle.query(names.QUERY_STATUS,
                                                      result_type=SupervisorStatus,
                                                      rpc_timeout=CALL_TIMEOUT)  # fmt: skip
        revision = int(row["revision"])
        if status.revision >= revision:
            return f"supervisor {started} at revision {status.revision}"
        payload = row["payload"]
        update: SetControl | SetLimits
        if row["kind"] == names.INTENT_LIMITS:
            name, update = names.UPDATE_SET_LIMITS, SetLimits(payload["limits"], revision)
        else:
            name = names.UPDATE_SET_CONTROL
            update = SetControl(payload["state"], revision, payload.get("pause_reason"))
        try:
            done: SupervisorStatus = await handle.execute_update(
                name, update, id=f"intent-{row['id']}", result_type=SupervisorStatus
            )
        except WorkflowUpdateFailedError as exc:
            raise IntentFailed(f"refused: {failures.reason(exc)}") from exc
        return f"{done.state} at revision {done.revision}"

    async def _reset(self, conn: Conn, client: Client, row: dict[str, Any]) -> str:
        """The supervisor retires the generation; a lost one is not rebuilt to do it."""
        employee, generation = str(row["employee"]), int(row["generation"])
        sid = names.supervisor_id(employee, generation)
        status = await _describe(client, sid)
        if status == WorkflowExecutionStatus.RUNNING:
            return await self._update(client, row, "running")
        await Effects(self.pool, client, self.workflow_queue).retire(employee, generation)
        return "retired without a supervisor (it was not running)"

    async def _interrupt(self, client: Client, row: dict[str, Any]) -> str:
        """Stop the conversation's running turn of a lower class than the owner's."""
        handle = client.get_workflow_handle(row["payload"]["entity_id"])
        try:
            status: EntityStatus = await handle.query(names.QUERY_STATUS, result_type=EntityStatus,
                                                      rpc_timeout=CALL_TIMEOUT)  # fmt: skip
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return "no turn running (the conversation is idle)"
            raise
        if status.turn_id is None:
            return "no turn running"
        try:
            await handle.execute_update(names.UPDATE_INTERRUPT,
                                        InterruptTurn(status.turn_id, by_class=names.C1_OWNER),
                                        id=f"intent-{row['id']}")  # fmt: skip
        except WorkflowUpdateFailedError as exc:
            return f"nothing to interrupt: {exc.cause or exc}"
        return f"turn {status.turn_id} stops at its next merge point"


def _unreachable(exc: BaseException) -> bool:
    """Temporal did not answer at all (as opposed to answering no)."""
    if isinstance(exc, RPCError):
        return exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)
    return isinstance(exc, TimeoutError | OSError) or "connect" in str(exc).lower()


async def _describe(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    """A workflow's status, or None when Temporal does not know it."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe(rpc_timeout=CALL_TIMEOUT)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return desc.status


LOST = (
    WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT, WorkflowExecutionStatus.CANCELED,
)  # fmt: skip


async def ensure_supervisor(conn: Conn, client: Client, employee: str, generation: int,
                            queue: str) -> tuple[str, int]:  # fmt: skip
    """The generation's supervisor runs: `running` already, `started` from the database, or
    `rebuilt` in place after it was lost; with the revision it was started at (-1: running)."""
    sid = names.supervisor_id(employee, generation)
    status = await _describe(client, sid)
    if status == WorkflowExecutionStatus.RUNNING:
        return "running", -1
    params = {"employee": employee, "generation": generation}
    if status is not None and status not in LOST:
        raise IntentFailed(f"supervisor {sid} is {status.name.lower()} but the generation is live")
    reuse = WorkflowIDReusePolicy.REJECT_DUPLICATE
    if status in LOST:
        cur = await conn.execute(Q["supervisor_rebuilds_recent"], params)
        if int((await cur.fetchone() or {})["n"]) >= names.SUPERVISOR_REBUILDS_PER_HOUR:
            limit = names.SUPERVISOR_REBUILDS_PER_HOUR
            detail = f"supervisor of generation {generation} lost {limit} times in an hour; Reset"
            await conn.execute(Q["attention_raise"], {
                "employee": employee, "kind": names.ATTENTION_SUPERVISOR_LOST,
                "severity": "error", "ref": sid, "detail": detail,
            })  # fmt: skip
            raise SupervisorLost(detail)
        await conn.execute(Q["supervisor_rebuild_insert"], params)
        reuse = WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY
    cur = await conn.execute(Q["generation_control"], params)
    row = await cur.fetchone()
    if row is None:
        raise IntentFailed(f"no generation {generation} of {employee!r}")
    control = Control.from_row(row)
    try:
        await client.start_workflow(
            names.WF_SUPERVISOR, SupervisorInput(employee, generation, control), id=sid,
            task_queue=queue, id_reuse_policy=reuse,
            priority=Priority(priority_key=names.SUPERVISOR_PRIORITY, fairness_key=employee),
            rpc_timeout=CALL_TIMEOUT,
        )  # fmt: skip
    except WorkflowAlreadyStartedError:
        return "running", -1  # another deliverer started it meanwhile
    return ("rebuilt" if status in LOST else "started"), control.revision


async def _turn_lost(client: Client, turn_id: str, entity_id: str) -> bool:
    """Neither the turn runs nor does a running entity hold its slot (the entity gives the slot
    back after the turn ends; a run that replaced a lost entity never had this turn)."""
    running = WorkflowExecutionStatus.RUNNING
    if await _describe(client, turn_id) == running:
        return False
    if await _describe(client, entity_id) != running:
        return True
    handle = client.get_workflow_handle(entity_id)
    status: EntityStatus = await handle.query(names.QUERY_STATUS, result_type=EntityStatus,
                                              rpc_timeout=CALL_TIMEOUT)  # fmt: skip
    return status.slot_of != turn_id


async def rearm(pool: AsyncConnectionPool[Conn], client: Client, queue: str,
                sched: SchedConfig | None = None, *, outbox: OutboxKeys) -> str:  # fmt: skip
    """Recreate from the database what should exist in Temporal (I10): every live generation's
    supervisor, Schedules and PollWorkflows; turns Temporal lost are ended and their slots given
    back, and the replies they queued but could not send are sent; a stream whose entity is gone
    gets what it was sent back as pending, for the relay."""
    effects = Effects(pool, client, queue)
    supervisors = schedules = lost_turns = sends = streams = 0
    async with pool.connection() as conn:
        cur = await conn.execute(Q["generations_live_all"])
        for gen in await cur.fetchall():
            e, g = str(gen["employee"]), int(gen["generation"])
            async with conn.transaction():
                try:
                    how, _ = await ensure_supervisor(conn, client, e, g, queue)
                except SupervisorLost:
                    continue
            supervisors += how != "running"
            if how == "running":  # a new run makes them itself
                await effects.ensure_schedules(e, g, paused=gen["state"] == names.GEN_PAUSED)
                if gen["state"] == names.GEN_RUNNING:
                    await effects.ensure_polls(e, g)
                schedules += 1
        cur = await conn.execute(Q["turns_running_all"])
        for t in await cur.fetchall():
            # Its entity may have given the slot back since the list was read: count only
            # what this release changed.
            if await _turn_lost(client, t["id"], t["entity_id"]):
                changed, wake = await admission.release(
                    conn, sched or SchedConfig(), t["id"], names.TURN_CANCELLED, "lost by Temporal"
                )
                lost_turns += changed
                await wake_entities(client, wake)
        cur = await conn.execute(Q["outbox_orphaned"])
        for o in await cur.fetchall():
            if o["kind"] == names.KIND_CHAT:  # once: the send claims the row first
                await egress.send_chat(conn, int(o["id"]), outbox)
            else:  # a channel's provider is called by the egress only, which sends it next
                await conn.execute(Q["outbound_hand_to_egress"], {"id": o["id"]})
            sends += 1
        cur = await conn.execute(Q["streams_holding"])
        for s in await cur.fetchall():
            if await _describe(client, s["entity_id"]) != WorkflowExecutionStatus.RUNNING:
                await conn.execute(Q["stream_redeliver"], {"stream_key": s["stream_key"]})
                streams += 1
    return (
        f"re-armed: {supervisors} supervisor(s) started, {schedules} schedule set(s) checked, "
        f"{lost_turns} lost turn(s) ended, {sends} orphaned send(s) made, "
        f"{streams} stream(s) to redeliver"
    )


async def ask_rearm(pool: AsyncConnectionPool[Conn]) -> None:
    """Ask for the boot re-arm, riding out a database that does not answer yet or is not migrated
    yet (on a cluster the relay may start before PostgreSQL, and with the chart's bundled
    PostgreSQL before the migration Job): tried again with a growing delay, each wait logged."""
    delay = 1.0
    while True:
        try:
            async with translate(), pool.connection() as conn:
                await intents.rearm(conn)
            return
        except DatabaseUnavailable as exc:
            log.warning("boot re-arm: the database does not answer (%s); again in %.0f s",
                        exc, delay)  # fmt: skip
        except psycopg.errors.UndefinedTable:
            log.warning("boot re-arm: the database is not migrated yet (eventosctl migrate); "
                        "again in %.0f s", delay)  # fmt: skip
        await asyncio.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_S)


async def deliverer_loop(deliverer: Deliverer, poll_s: float) -> None:
    """Re-arm once at boot (as an intent, so it shows), then apply due intents every
    `poll_s` (intents are rare; a pass that settled some looks again at once)."""
    await ask_rearm(deliverer.pool)
    while True:
        try:
            if await deliverer.pass_once():
                continue
        except Exception:
            log.exception("deliverer pass failed")
        await asyncio.sleep(poll_s)
