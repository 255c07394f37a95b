"""What a generation's control state means in Temporal, and the trigger ticks (SPEC §7, §10).

The database side of Start, Stop, Resume and Reset commits with the owner's intent
(eventos.employees.intents). This module makes the Temporal side true, idempotently, for the
supervisor's activities, the deliverer and re-arm:
- running: the generation is active, `start` triggers fired once, cron Schedules exist and
  run, each poll trigger's PollWorkflow runs, entities holding inputs are woken;
- paused: Schedules paused, running turns stopped at their next merge point (their inputs
  stay pending; admission refuses new turns until Resume); polls stop (an attempt that finds
  its generation not running ends its PollWorkflow, so a quick Resume keeps the same run);
- retired: Schedules deleted, PollWorkflows cancelled, entities cancelled (they drain their
  turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    WorkflowUpdateFailedError,
)
from temporalio.common import Priority, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from eventos import failures, names
from eventos.bus.envelope import encoded_size, new_event_id
from eventos.bus.inbox import Accepted, IngressRecord, append
from eventos.contracts import (
    ApplyControl,
    BudgetRefresh,
    BudgetStatus,
    InterruptTurn,
    PollTrigger,
    ScheduleFire,
)
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.employees import lifecycle
from eventos.scheduling import ledger
from eventos.spec import cron
from eventos.spec.model import parse_spec

log = logging.getLogger(__name__)
CALL_TIMEOUT = timedelta(seconds=10)  # each Temporal call these effects make
CRON_JITTER = timedelta(seconds=60)
FAIL_LATE_TRIES, FAIL_LATE_PAUSE_S = 20, 0.5  # marking a start failed whose row is busy
CATCHUP_MAX = timedelta(hours=1)
STOP_REASON = "the employee was stopped"
# Temporal's answers to a Schedule's creation that no retry changes (others, such as
# UNAVAILABLE, are retried by the activity's policy).
SCHEDULE_REFUSALS = (
    RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.FAILED_PRECONDITION, RPCStatusCode.OUT_OF_RANGE,
)  # fmt: skip
RELEASED_BY_RESUME = "resume"


def tick_record(employee: str, trigger: str, kind: str, dedupe_key: str,
                data: dict[str, Any]) -> IngressRecord:  # fmt: skip
    """A trigger's tick as an ingress record of source `<kind>:<employee>/<trigger>` (C4)."""
    event_id = new_event_id()
    event_type = names.TYPE_TRIGGER_START if kind == "start" else names.TYPE_TRIGGER_CRON
    envelope = {
        "specversion": "1.0", "id": event_id, "source": f"/employees/{employee}/{trigger}",
        "type": event_type, "subject": trigger, "datacontenttype": "application/json",
        "data": data,
    }  # fmt: skip
    return IngressRecord(
        source_key=names.source_key(kind, f"{employee}/{trigger}"), dedupe_key=dedupe_key,
        type=event_type, chain_id=event_id, envelope=envelope, size=encoded_size(envelope),
        klass=names.C4_BACKGROUND,
    )  # fmt: skip


def triggers_of(spec_doc: dict[str, Any], kind: str) -> list[tuple[str, Any]]:
    """(name, trigger) of each trigger of `kind` in a generation's frozen spec."""
    spec = parse_spec(spec_doc, stored=True)
    pairs = zip(spec.trigger_names(), spec.spec.triggers, strict=True)
    return [(name, t) for name, t in pairs if t.kind == kind]


async def fire_start_once(conn: Conn, employee: str, generation: int) -> int:
    """Append the generation's `start` ticks, once per generation (dedupe `start:<gen>`, and a
    compare-and-swap on the generation in the same transaction). Returns how many."""
    async with conn.transaction():
        cur = await conn.execute(
            Q["generation_fire_start"], {"employee": employee, "generation": generation}
        )
        row = await cur.fetchone()
        if row is None:
            return 0
        records = [
            tick_record(employee, name, "start", f"start:{generation}",
                        {"text": t.text or f"[start trigger {name}]", "trigger": name})
            for name, t in triggers_of(row["spec"], "start")
        ]  # fmt: skip
        await append(conn, records)
    return len(records)


def cron_interval(expr: str) -> timedelta:
    """A cron expression's shortest interval, as far as the catch-up window needs it (capped
    at one hour): `@every`'s, every minute, every n minutes, or n times an hour; else an hour
    or more."""
    interval = cron.every(expr)
    if interval is not None:
        return interval
    fields = (cron.five_fields(expr) or expr).split()
    if len(fields) < 2:  # not a cron expression (Temporal refuses it: schedule_refused)
        return CATCHUP_MAX
    minute, hour = fields[:2]
    if minute == "*":
        return timedelta(minutes=1)
    if minute.startswith("*/") and minute[2:].isdigit():
        return timedelta(minutes=int(minute[2:]))
    if hour == "*" or hour.startswith("*/"):
        per_hour = len(minute.split(","))
        return timedelta(minutes=60 // per_hour)
    return CATCHUP_MAX


def cron_schedule(employee: str, generation: int, name: str, trigger: Any, time_zone: str,
                  queue: str, *, paused: bool) -> Schedule:  # fmt: skip
    """A cron trigger's Schedule: its action appends a C4 tick (ScheduleFireWorkflow)."""
    sid = names.schedule_id(employee, generation, name)
    expr = str(trigger.schedule)
    action = ScheduleActionStartWorkflow(
        names.WF_SCHEDULE_FIRE, ScheduleFire(employee, generation, name, sid, trigger.text or ""),
        id=f"fire-{sid}", task_queue=queue,
        priority=Priority(priority_key=names.TRIGGER_PRIORITY, fairness_key=employee),
    )  # fmt: skip
    return Schedule(
        action=action,
        spec=ScheduleSpec(cron_expressions=[expr], jitter=CRON_JITTER, time_zone_name=time_zone),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.BUFFER_ONE,
                              catchup_window=min(cron_interval(expr), CATCHUP_MAX)),
        state=ScheduleState(paused=paused, note=STOP_REASON if paused else None),
    )  # fmt: skip


async def _tolerate_missing(call: Awaitable[object]) -> None:
    """Run a Temporal call whose target may already be gone (that is the wanted end state)."""
    try:
        await call
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise


class Effects:
    """Makes a generation's control state true in Temporal (every step idempotent)."""

    def __init__(self, pool: AsyncConnectionPool[Conn], client: Client, workflow_queue: str):
        self.pool = pool
        self.client = client
        self.queue = workflow_queue

    async def _rows(self, query: str, employee: str, generation: int) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(Q[query], {"employee": employee, "generation": generation})
            return await cur.fetchall()

    async def converge(self, req: ApplyControl) -> None:
        """A supervisor's first run: the generation runs, `start` fires once, Schedules exist."""
        async with self.pool.connection() as conn:
            if req.state == names.GEN_STARTING:
                await lifecycle.activate_generation(conn, req.employee, req.generation)
            fired = await fire_start_once(conn, req.employee, req.generation)
        if fired:
            log.info("%s g%d: %d start trigger(s) fired", req.employee, req.generation, fired)
        await self.ensure_schedules(req.employee, req.generation,
                                    paused=req.state == names.GEN_PAUSED)  # fmt: skip
        if req.state != names.GEN_PAUSED:
            await self.ensure_polls(req.employee, req.generation)

    async def ensure_schedules(self, employee: str, generation: int, *, paused: bool) -> None:
        """Create each cron trigger's Schedule that does not exist (paused when stopped)."""
        (row,) = await self._rows("generation_control", employee, generation)
        zone = str(row["spec"].get("spec", {}).get("timezone", "UTC"))
        for name, t in triggers_of(row["spec"], "cron"):
            schedule = cron_schedule(employee, generation, name, t, zone, self.queue,
                                     paused=paused)  # fmt: skip
            sid = names.schedule_id(employee, generation, name)
            try:
                with contextlib.suppress(ScheduleAlreadyRunningError):
                    await self.client.create_schedule(sid, schedule, rpc_timeout=CALL_TIMEOUT)
            except RPCError as exc:
                # Temporal's answer is final: retrying it would loop for ever, unseen.
                if exc.status not in SCHEDULE_REFUSALS:
                    raise
                await self.schedule_refused(employee, generation, name, sid,
                                            failures.reason(exc, 300))  # fmt: skip

    async def schedule_refused(self, employee: str, generation: int, trigger: str, sid: str,
                               cause: str) -> None:  # fmt: skip
        """A cron Schedule Temporal refuses (a spec stored before apply checked it): the
        trigger does not run; the start or resume that made it fails with the cause, and an
        attention item says what to do. The generation's other triggers run."""
        detail = (f"cron trigger {trigger!r} of generation {generation} does not run: Temporal "
                  f"refused its Schedule ({cause}); fix its schedule or the spec's timezone, "
                  "apply, then reset and start")  # fmt: skip
        log.warning("%s g%d: %s", employee, generation, detail)
        async with self.pool.connection() as conn:
            async with conn.transaction():
                await conn.execute(Q["attention_raise"], {
                    "employee": employee, "kind": names.ATTENTION_SCHEDULE_REFUSED,
                    "severity": "error", "ref": sid, "detail": detail,
                })  # fmt: skip
            # The deliverer may hold the intent's row until it commits its settle (a start:
            # moments); a re-arm in the same pass could hold it while it waits for this call,
            # so the row is never waited on: a few tries, then the item alone says it.
            params = {"employee": employee, "generation": generation, "outcome": detail}
            for _ in range(FAIL_LATE_TRIES):
                async with conn.transaction():
                    cur = await conn.execute(Q["intent_fail_late"], params)
                    marked = await cur.fetchone() is not None
                if marked:
                    return
                await asyncio.sleep(FAIL_LATE_PAUSE_S)
            log.warning("%s g%d: its start intent stayed busy; the item says it", employee,
                        generation)  # fmt: skip

    async def ensure_polls(self, employee: str, generation: int) -> None:
        """Each poll trigger's PollWorkflow runs (USE_EXISTING: a running one is kept)."""
        (row,) = await self._rows("generation_control", employee, generation)
        for name, _ in triggers_of(row["spec"], "poll"):
            await self.client.start_workflow(
                names.WF_POLL, PollTrigger(employee, generation, name),
                id=names.poll_id(employee, generation, name), task_queue=self.queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                priority=Priority(priority_key=names.TRIGGER_PRIORITY, fairness_key=employee),
                rpc_timeout=CALL_TIMEOUT,
            )  # fmt: skip

    async def _each_schedule(self, employee: str, generation: int,
                             act: Callable[[Any], Awaitable[object]]) -> None:  # fmt: skip
        (row,) = await self._rows("generation_control", employee, generation)
        for name, _ in triggers_of(row["spec"], "cron"):
            handle = self.client.get_schedule_handle(names.schedule_id(employee, generation, name))
            await _tolerate_missing(act(handle))

    async def apply(self, req: ApplyControl) -> None:
        """The effects of a control state (after `converge` on a supervisor's first run)."""
        if req.first:
            await self.converge(req)
        e, g = req.employee, req.generation
        if req.state == names.GEN_PAUSED:
            await self._each_schedule(e, g, lambda h: h.pause(note=STOP_REASON))
            if req.pause_reason != names.PAUSE_BUDGET:  # those turns suspend at their next step
                await self.stop_turns(e, g)
        elif req.state == names.GEN_RUNNING:
            await self._each_schedule(e, g, lambda h: h.unpause(note="resumed"))
            await self.ensure_polls(e, g)
            await self.wake_entities(e, g)
            await self.release_suspended(e)
        elif req.state == names.GEN_RETIRED:
            await self.retire(e, g)

    async def retire(self, employee: str, generation: int) -> None:
        """Delete the Schedules, end the polls and cancel every entity (each drains its turn)."""
        await self._each_schedule(employee, generation, lambda h: h.delete())
        (row,) = await self._rows("generation_control", employee, generation)
        for name, _ in triggers_of(row["spec"], "poll"):
            handle = self.client.get_workflow_handle(names.poll_id(employee, generation, name))
            await _tolerate_missing(handle.cancel(rpc_timeout=CALL_TIMEOUT))
        for row in await self._rows("generation_entities", employee, generation):
            handle = self.client.get_workflow_handle(row["entity_id"])
            await _tolerate_missing(handle.cancel(rpc_timeout=CALL_TIMEOUT))

    async def stop_turns(self, employee: str, generation: int) -> None:
        """Each running turn stops at its next merge point; its inputs stay pending."""
        for row in await self._rows("generation_running_turns", employee, generation):
            handle = self.client.get_workflow_handle(row["entity_id"])
            # by_class 0 outranks every class: any running turn stops.
            req = InterruptTurn(row["turn_id"], by_class=0, reason=STOP_REASON)
            try:
                await asyncio.wait_for(
                    handle.execute_update(names.UPDATE_INTERRUPT, req,
                                          id=f"stop-{row['turn_id']}"),
                    CALL_TIMEOUT.total_seconds(),
                )  # fmt: skip
            except WorkflowUpdateFailedError:
                pass  # the turn ended or is already stopping: nothing left to stop
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise

    async def release_suspended(self, employee: str) -> None:
        """Suspended and parked turns ask admission again (Resume releases a park)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(Q["leases_suspended"], {"employee": employee})
            turns = [str(r["turn_id"]) for r in await cur.fetchall()]
        await self.release_turns(turns, RELEASED_BY_RESUME)

    async def release_turns(self, turn_ids: list[str], reason: str) -> None:
        """`released{reason}` to these suspended turns (a hint: each asks admission)."""
        for turn_id in turn_ids:
            handle = self.client.get_workflow_handle(turn_id)
            await _tolerate_missing(handle.signal(names.SIGNAL_RELEASED, reason,
                                                  rpc_timeout=CALL_TIMEOUT))  # fmt: skip

    async def wake_entities(self, employee: str, generation: int) -> None:
        """Entities holding inputs ask admission again (it refused them while paused)."""
        for row in await self._rows("generation_entities", employee, generation):
            if row["holding"]:
                handle = self.client.get_workflow_handle(row["entity_id"])
                await _tolerate_missing(handle.signal(names.SIGNAL_WAKE, rpc_timeout=CALL_TIMEOUT))


async def tick_interval_s(conn: Conn, req: ScheduleFire, scheduled_for: str) -> float | None:
    """The tick's interval: until its schedule's next time (a tick pending longer expires)."""
    cur = await conn.execute(Q["generation_control"],
                             {"employee": req.employee, "generation": req.generation})  # fmt: skip
    row = await cur.fetchone()
    if row is None:
        return None
    zone = str(row["spec"].get("spec", {}).get("timezone", "UTC"))
    for name, t in triggers_of(row["spec"], "cron"):
        if name == req.trigger:
            gap = cron.interval_after(str(t.schedule), zone, datetime.fromisoformat(scheduled_for))
            return gap.total_seconds() if gap is not None else None
    return None


async def fire_schedule(conn: Conn, req: ScheduleFire, scheduled_for: str) -> bool:
    """Append a cron tick once per scheduled time (dedupe `<schedule>:<scheduled time>`),
    carrying its interval (`every_s`: the relay and the router expire it past that, SPEC §15)."""
    data: dict[str, Any] = {"text": req.text or f"[cron trigger {req.trigger} fired]",
                            "trigger": req.trigger, "scheduled_for": scheduled_for}  # fmt: skip
    every_s = await tick_interval_s(conn, req, scheduled_for)
    if every_s is not None:
        data["every_s"] = every_s
    dedupe = f"{req.schedule_id}:{scheduled_for}"
    (outcome,) = await append(conn, [tick_record(req.employee, req.trigger, "cron", dedupe, data)])
    return isinstance(outcome, Accepted)


class SupervisorActivities:
    """The supervisor's and ScheduleFireWorkflow's activities (workers-workflow)."""

    def __init__(self, pool: AsyncConnectionPool[Conn]) -> None:
        self.pool = pool

    @activity.defn(name=names.ACT_APPLY_CONTROL)
    async def apply_control(self, req: ApplyControl) -> None:
        effects = Effects(self.pool, activity.client(), activity.info().task_queue)
        await effects.apply(req)

    @activity.defn(name=names.ACT_FIRE_SCHEDULE)
    async def fire_schedule(self, req: ScheduleFire, scheduled_for: str) -> bool:
        async with self.pool.connection() as conn:
            return await fire_schedule(conn, req, scheduled_for)

    @activity.defn(name=names.ACT_BUDGET_REFRESH)
    async def budget_refresh(self, req: BudgetRefresh) -> BudgetStatus:
        """Lower the budget's state if its period ended or the limit rose; make it true in
        Temporal: a lifted budget pause resumes, held work is woken, suspended turns released."""
        async with self.pool.connection() as conn:
            done = await ledger.refresh(conn, req.employee)
        effects = Effects(self.pool, activity.client(), activity.info().task_queue)
        if done.resumed is not None:
            await effects.apply(ApplyControl(req.employee, req.generation, names.GEN_RUNNING))
        elif done.state != names.BUDGET_MAX:  # the work the budget held may ask again
            await effects.wake_entities(req.employee, req.generation)
        await effects.release_turns(done.released_turns, names.PAUSE_BUDGET)
        return BudgetStatus(done.state, done.period_end, done.resumed)

    def activities(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.apply_control, self.fire_schedule, self.budget_refresh]
