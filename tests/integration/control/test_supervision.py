"""Employees under supervision, on the real dev server and PostgreSQL: owner intents and their
deliverer, EmployeeSupervisorWorkflow, start-once, cron Schedules, rebuilds and re-arm."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    ScheduleBackfill,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleOverlapPolicy,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.common import Priority, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode
from test_router import append_all, driver_event, query
from test_turns import (  # noqa: F401 (`instance` is a fixture)
    Instance,
    instance,
    local_spec,
    slots_given_back,
    step_started,
    two_classes,
)

from eventos import names
from eventos.contracts import (
    AdmitRequest,
    Control,
    SetControl,
    SetLimits,
    SupervisorInput,
    SupervisorStatus,
)
from eventos.control.intent_deliverer import rearm
from eventos.employees import intents
from eventos.local.ports import free_port
from eventos.runtime.temporal import TemporalConnection
from eventos.scheduling import admission
from eventos.scheduling.policy import SchedConfig
from eventos.settings import TemporalSettings
from eventos.testing import ConditionTimeout, wait_for

pytestmark = pytest.mark.temporal

UPDATE_EVENT_TYPES = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ADMITTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_REJECTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
}


def supervised(name: str) -> str:
    """Owner chat, a `start` trigger, a nightly cron trigger and a gRPC driver (C3)."""
    return local_spec(
        name,
        f"""    - {{kind: chat}}
    - {{kind: start, text: good morning}}
    - {{kind: cron, name: nightly, schedule: "0 3 * * *"}}
    - {{kind: grpc, driver: drv-{name}, thread_by: subject}}
""",
    )


async def post(instance: Instance, path: str, status: int = 202, **kw: Any) -> dict[str, Any]:
    r = await instance.api.post(path, **kw)
    assert r.status_code == status, r.text
    return r.json()  # type: ignore[no-any-return]


async def settled(
    instance: Instance, intent: dict[str, Any], timeout: float = 30
) -> dict[str, Any]:
    """The intent once the deliverer settled it."""

    async def done() -> dict[str, Any] | None:
        got = (await instance.api.get(f"/v1/intents/{intent['id']}")).json()
        return got if got["state"] != names.INTENT_APPLYING else None

    return await wait_for(done, timeout=timeout, interval=0.1, what=f"intent {intent['id']}")


async def applied(instance: Instance, name: str, action: str, **kw: Any) -> dict[str, Any]:
    """POST the action, then wait until its intent is applied."""
    answer = await post(instance, f"/v1/employees/{name}:{action}", **kw)
    assert answer["intent"]["state"] == names.INTENT_APPLYING
    intent = await settled(instance, answer["intent"])
    assert intent["state"] == names.INTENT_APPLIED, intent
    return intent


async def new_employee(instance: Instance, spec: Any = supervised) -> str:
    name = f"s{uuid.uuid4().hex[:8]}"
    await post(instance, "/v1/employees", status=200, content=spec(name))
    return name


async def supervisor_status(instance: Instance, name: str, gen: int = 1) -> SupervisorStatus:
    handle = instance.client.get_workflow_handle(names.supervisor_id(name, gen))
    return await handle.query(names.QUERY_STATUS, result_type=SupervisorStatus)  # type: ignore[no-any-return]


async def state_of(instance: Instance, name: str) -> str:
    return str((await instance.api.get(f"/v1/employees/{name}")).json()["state"])


async def start_ticks(instance: Instance, name: str) -> int:
    rows = await query(instance.pool, "SELECT count(*) AS n FROM bus_ingress WHERE source_key = %s",
                       f"start:{name}/start")  # fmt: skip
    return int(rows[0]["n"])


async def test_start_applies_through_the_supervisor_and_an_event_right_after_start_is_answered(
    instance: Instance,
) -> None:
    """EG12: a message accepted just after Start committed is answered once the generation
    runs; the start trigger fires once however often supervisors are started (EG10)."""
    name = await new_employee(instance)
    started = await post(instance, f"/v1/employees/{name}:start")
    assert (started["state"], started["intent"]["state"]) == ("starting", "applying")
    r = await instance.api.post(f"/v1/employees/{name}/chat",
                                json={"client_message_id": "right-after", "text": "early bird"})  # fmt: skip
    assert r.status_code == 202
    intent = await settled(instance, started["intent"])
    assert intent["state"] == names.INTENT_APPLIED and "started" in intent["outcome"]
    assert "early bird" in await instance.reply(r.json()["message_id"], name=name)
    assert await state_of(instance, name) == names.GEN_RUNNING
    status = await supervisor_status(instance, name)
    assert (status.state, status.revision, status.updates) == ("running", 1, 0)
    assert "roll" in status.deadlines  # the one timer's only deadline so far
    # The start tick was appended, routed and run.
    assert await start_ticks(instance, name) == 1

    async def tick_done() -> bool:
        q = "SELECT status FROM bus_deliveries WHERE type = %s"
        return [r["status"] for r in await query(instance.pool, q, names.TYPE_TRIGGER_START)] == [
            "done"
        ]

    await wait_for(tick_done, timeout=30, what="the start tick consumed")
    # Services restarting twice: two boot re-arms, and a supervisor lost and rebuilt (its new
    # run converges again). Still one start tick.
    for _ in range(2):
        await rearm(
            instance.pool,
            instance.client,
            instance.deliverer.workflow_queue,
            outbox=instance.deliverer.outbox,
        )
    handle = instance.client.get_workflow_handle(names.supervisor_id(name, 1))
    await handle.terminate("test: lost supervisor")
    rebuilt = await applied(instance, name, "stop")
    assert "rebuilt" in rebuilt["outcome"]
    assert (await supervisor_status(instance, name)).state == names.GEN_PAUSED
    assert await start_ticks(instance, name) == 1


async def test_stop_resume_reset_with_inputs_arriving_throughout(instance: Instance) -> None:
    name = await new_employee(instance)
    await applied(instance, name, "start")
    source = f"grpc:drv-{name}"
    chore = "long chore\nsleep: 3\ncall: lookup {}"  # two steps: a merge point between them
    await append_all(instance.pool, [driver_event("a", 1, source, text=chore)])

    async def running_turn() -> str | None:
        q = "SELECT id FROM turns WHERE employee = %s AND thread <> 'main' AND status = 'running'"
        rows = await query(instance.pool, q, name)
        return rows[0]["id"] if rows else None

    turn_id = await wait_for(running_turn, timeout=20, what="the turn running")
    stopped = await applied(instance, name, "stop")
    assert stopped["revision"] == 2
    # Stop: the running turn ends at its next merge point, its input stays pending.

    async def interrupted() -> bool:
        rows = await query(instance.pool, "SELECT status FROM turns WHERE id = %s", turn_id)
        return rows[0]["status"] == names.TURN_INTERRUPTED

    await wait_for(interrupted, timeout=20, what="the turn stopped at its merge point")
    # Inputs arriving while paused are accepted and routed, and wait.
    await append_all(instance.pool, [driver_event("a", 2, source), driver_event("b", 3, source)])
    message = (await post(instance, f"/v1/employees/{name}/chat",
                          json={"client_message_id": "paused", "text": "while paused"}))  # fmt: skip

    seen: list[list[dict[str, Any]]] = []

    async def routed_and_held() -> bool:
        # The start trigger's input is left out (as below): on a slow machine its turn may
        # not have run before the stop, and then it waits with the others.
        q = """SELECT d.seq, s.thread, d.status, s.hold_reason FROM bus_deliveries d
               JOIN bus_streams s USING (stream_key) WHERE s.employee = %s AND d.type <> %s
               ORDER BY 2, 1"""
        rows = await query(instance.pool, q, name, names.TYPE_TRIGGER_START)
        seen[:] = [rows]
        waiting = [r for r in rows if r["status"] == "pending"]
        return len(waiting) == 3 and all(r["hold_reason"] == "paused" for r in waiting)

    try:
        await wait_for(routed_and_held, timeout=15, what="the paused inputs routed and held")
    except ConditionTimeout as e:
        raise ConditionTimeout(f"{e}; the employee's deliveries: {seen}") from None
    assert (await instance.api.get(f"/v1/employees/{name}/chat/{message['message_id']}")).json()[
        "reply"
    ] is None
    await applied(instance, name, "resume")
    assert "while paused" in await instance.reply(message["message_id"], name=name)

    async def all_consumed() -> bool:
        q = """SELECT d.status FROM bus_deliveries d JOIN bus_streams s USING (stream_key)
               WHERE s.employee = %s AND d.type <> %s"""
        rows = await query(instance.pool, q, name, names.TYPE_TRIGGER_START)
        return len(rows) == 4 and {r["status"] for r in rows} == {"done"}

    await wait_for(all_consumed, timeout=40, what="every input consumed once resumed")
    # Each input was consumed by exactly one turn's save (done once, never dead or repeated).
    repeats = await query(instance.pool, """SELECT ingress_id, count(*) AS n FROM bus_deliveries
                                            GROUP BY ingress_id HAVING count(*) > 1""")  # fmt: skip
    assert repeats == []
    # Reset with inputs arriving: nothing reaches the retired generation's entities.
    await append_all(instance.pool, [driver_event("c", 4, source, text="sleep: 2")])
    reset = await applied(instance, name, "reset")
    assert reset["revision"] == 4
    status = await instance.client.get_workflow_handle(names.supervisor_id(name, 1)).describe()
    assert status.status == WorkflowExecutionStatus.COMPLETED
    late = await append_all(instance.pool, [driver_event("c", 5, source)])
    open_rows = await query(instance.pool, """SELECT d.status FROM bus_deliveries d
        JOIN bus_streams s USING (stream_key)
        WHERE s.employee = %s AND d.status IN ('pending', 'held', 'delivered')""", name)  # fmt: skip
    assert open_rows == []
    entities = await query(instance.pool, "SELECT entity_id FROM bus_streams WHERE employee = %s",
                           name)  # fmt: skip

    async def entities_closed() -> bool:
        for e in entities:
            d = await instance.client.get_workflow_handle(e["entity_id"]).describe()
            if d.status == WorkflowExecutionStatus.RUNNING:
                return False
        return True

    await wait_for(entities_closed, timeout=30, what="the retired generation's entities closed")

    async def late_settled() -> bool:
        rows = await query(instance.pool, "SELECT status FROM bus_ingress WHERE id = %s", late[0])
        return rows[0]["status"] != names.INGRESS_ACCEPTED

    await wait_for(late_settled, timeout=15, what="the late event routed")
    after = await query(instance.pool, "SELECT status FROM bus_ingress WHERE id = %s", late[0])
    assert after[0]["status"] == names.INGRESS_NO_CONSUMER


async def test_a_stale_revision_is_refused_without_history(instance: Instance) -> None:
    name = await new_employee(instance)
    await applied(instance, name, "start")
    limits = await post(instance, f"/v1/employees/{name}/limits", json={"daily_usd": 7})
    assert (await settled(instance, limits["intent"]))["state"] == names.INTENT_APPLIED
    status = await supervisor_status(instance, name)
    assert (status.revision, status.limits, status.updates) == (2, {"daily_usd": 7.0}, 1)
    handle = instance.client.get_workflow_handle(names.supervisor_id(name, 1))

    async def update_events() -> list[int]:
        # Only Update events: the supervisor's own timers and activities may add others while
        # the test runs (on a loaded machine they do).
        return [e.event_id async for e in handle.fetch_history_events()
                if e.event_type in UPDATE_EVENT_TYPES]  # fmt: skip

    before = await update_events()
    assert before  # the limits Update above: accepted, then completed
    refusals = [
        (names.UPDATE_SET_CONTROL, SetControl("paused", 2), "stale revision 2"),
        (names.UPDATE_SET_LIMITS, SetLimits({"daily_usd": 1}, 1), "stale revision 1"),
        (names.UPDATE_SET_CONTROL, SetControl("dancing", 9), "unknown control state"),
    ]
    for update, arg, why in refusals:
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(update, arg)
        assert why in str(refused.value.cause)
    assert await update_events() == before  # a validator's refusal writes no history
    assert (await supervisor_status(instance, name)).revision == 2


async def test_intents_wait_while_temporal_is_unreachable_then_apply_in_order(
    instance: Instance,
) -> None:
    name = await new_employee(instance)
    await applied(instance, name, "start")
    real = instance.deliverer.temporal
    instance.deliverer.temporal = TemporalConnection(
        TemporalSettings(address=f"127.0.0.1:{free_port()}", namespace="default")
    )
    stop = (await post(instance, f"/v1/employees/{name}:stop"))["intent"]
    limits = (await post(instance, f"/v1/employees/{name}/limits", json={"daily_usd": 3}))["intent"]
    resume = (await post(instance, f"/v1/employees/{name}:resume"))["intent"]

    async def tried() -> dict[str, Any] | None:
        rows = await query(instance.pool, "SELECT attempts, outcome FROM intents WHERE id = %s",
                           stop["id"])  # fmt: skip
        return rows[0] if rows[0]["attempts"] >= 2 else None

    first = await wait_for(tried, timeout=20, what="two failed attempts")
    assert "connect" in first["outcome"].lower()
    later = await query(instance.pool, "SELECT state, attempts FROM intents WHERE id = ANY(%s)",
                        [limits["id"], resume["id"]])  # fmt: skip
    assert [(r["state"], r["attempts"]) for r in later] == [("applying", 0)] * 2  # in order
    shown = (await instance.api.get(f"/v1/employees/{name}")).json()
    assert (shown["state"], shown["intent"]["state"]) == ("running", "applying")
    instance.deliverer.temporal = real
    done = [await settled(instance, i, timeout=90) for i in (stop, limits, resume)]
    assert [d["state"] for d in done] == [names.INTENT_APPLIED] * 3
    assert done[0]["applied_at"] <= done[1]["applied_at"] <= done[2]["applied_at"]
    status = await supervisor_status(instance, name)
    assert (status.state, status.revision, status.limits) == ("running", 4, {"daily_usd": 3.0})


async def test_a_lost_supervisor_is_rebuilt_three_times_an_hour_then_asks_for_reset(
    instance: Instance,
) -> None:
    name = await new_employee(instance)
    await applied(instance, name, "start")
    handle = instance.client.get_workflow_handle(names.supervisor_id(name, 1))
    for usd in (1, 2, 3):
        await handle.terminate("test: lost")
        answer = await post(instance, f"/v1/employees/{name}/limits", json={"daily_usd": usd})
        intent = await settled(instance, answer["intent"])
        assert intent["state"] == names.INTENT_APPLIED and "rebuilt" in intent["outcome"]
        assert (await supervisor_status(instance, name)).limits == {"daily_usd": float(usd)}
    await handle.terminate("test: lost a fourth time")
    answer = await post(instance, f"/v1/employees/{name}/limits", json={"daily_usd": 4})
    intent = await settled(instance, answer["intent"])
    assert intent["state"] == names.INTENT_FAILED and "Reset" in intent["outcome"]
    items = await query(instance.pool, "SELECT kind, severity, detail FROM attention_items "
                        "WHERE employee = %s", name)  # fmt: skip
    assert [(i["kind"], i["severity"]) for i in items] == [
        (names.ATTENTION_SUPERVISOR_LOST, "error")
    ]
    # Reset still works without a supervisor: the generation retires, nothing is rebuilt.
    reset = await applied(instance, name, "reset")
    assert "without a supervisor" in reset["outcome"]
    rebuilds = await query(instance.pool, "SELECT count(*) AS n FROM supervisor_rebuilds "
                           "WHERE employee = %s", name)  # fmt: skip
    assert rebuilds[0]["n"] == 3


async def described(schedule: ScheduleHandle) -> ScheduleDescription | None:
    """The Schedule's description, or None while Temporal does not have it."""
    try:
        return await schedule.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def test_cron_schedule_fires_a_tick_once_per_time_and_pauses_with_stop(
    instance: Instance,
) -> None:
    name = await new_employee(instance)
    await applied(instance, name, "start")
    schedule = instance.client.get_schedule_handle(names.schedule_id(name, 1, "nightly"))
    # `start` is applied once the supervisor is started; its first run creates the Schedule
    # afterwards, in an activity (a Stop or Reset waits for that run: the supervisor's lock).
    desc = await wait_for(lambda: described(schedule), timeout=30,
                          what="the supervisor's first run created the Schedule")  # fmt: skip
    assert not desc.schedule.state.paused
    await schedule.trigger()

    async def ticks() -> list[dict[str, Any]]:
        q = "SELECT id FROM bus_ingress WHERE source_key = %s"
        return await query(instance.pool, q, f"cron:{name}/nightly")

    await wait_for(ticks, timeout=20, what="the cron tick appended")
    keys = await query(instance.pool, "SELECT dedupe_key FROM bus_dedupe WHERE source_key = %s",
                       f"cron:{name}/nightly")  # fmt: skip
    assert [
        k["dedupe_key"].startswith(f"{names.schedule_id(name, 1, 'nightly')}:") for k in keys
    ] == [True]
    await applied(instance, name, "stop")
    assert (await schedule.describe()).schedule.state.paused
    await applied(instance, name, "resume")
    assert not (await schedule.describe()).schedule.state.paused
    await applied(instance, name, "reset")
    with pytest.raises(RPCError) as gone:
        await schedule.describe()
    assert gone.value.status == RPCStatusCode.NOT_FOUND


async def test_the_owner_interrupts_a_lower_class_turn_through_an_intent(
    instance: Instance,
) -> None:
    name = f"i{uuid.uuid4().hex[:8]}"
    await post(instance, "/v1/employees", status=200, content=two_classes(name))
    await applied(instance, name, "start")
    await append_all(instance.pool, [driver_event("x", 1, f"grpc:low-{name}",
                                                  text="slow chore\nsleep: 4\ncall: lookup {}")])  # fmt: skip

    async def running() -> str | None:
        rows = await query(instance.pool, "SELECT id FROM turns WHERE employee = %s "
                           "AND status = 'running'", name)  # fmt: skip
        return rows[0]["id"] if rows else None

    low = await wait_for(running, timeout=20, what="the C4 turn running")
    await append_all(instance.pool, [driver_event("x", 2, f"grpc:high-{name}", text="urgent")])
    intent = await applied(instance, name, "interrupt", json={"conversation": "worker/main"})
    assert intent["outcome"] == f"turn {low} stops at its next merge point"

    async def order() -> list[tuple[str, int]] | None:
        rows = await query(instance.pool, "SELECT status, class FROM turns WHERE employee = %s "
                           "ORDER BY n", name)  # fmt: skip
        got = [(r["status"], r["class"]) for r in rows]
        return got if len(got) == 3 and got[-1][0] == "done" else None

    assert await wait_for(order, timeout=40, what="the C1 turn, then the C4 one again") == [
        ("interrupted", 4), ("done", 1), ("done", 4),
    ]  # fmt: skip
    # With nothing running, an interrupt applies and says so. The turn row is `done` at its
    # save; the entity holds the turn until the workflow has closed and given its slot back.
    await slots_given_back(instance, name)
    again = await applied(instance, name, "interrupt", json={"conversation": "worker/main"})
    assert again["outcome"].startswith("no turn running")


async def test_rearm_after_temporal_lost_everything_redelivers_and_ends_lost_turns(
    instance: Instance,
) -> None:
    """What re-arm does when Temporal no longer knows the generation's workflows: the
    supervisor is started again, a turn Temporal lost is ended and its slot given back, the
    stream's unconsumed inputs go back to pending and are consumed once."""
    name = await new_employee(instance)
    await applied(instance, name, "start")
    source = f"grpc:drv-{name}"
    await append_all(instance.pool, [driver_event("z", 1, source, text="sleep: 5")])

    async def running_turn() -> str | None:
        q = "SELECT id FROM turns WHERE employee = %s AND thread <> 'main' AND status = 'running'"
        rows = await query(instance.pool, q, name)
        return rows[0]["id"] if rows else None

    turn_id = await wait_for(running_turn, timeout=20, what="the turn running")
    await step_started(instance, turn_id)  # the turn workflow exists (admission comes first)
    entity = (await query(instance.pool, "SELECT entity_id FROM bus_streams WHERE employee = %s "
                          "AND lane = 'worker' AND thread <> 'main'", name))[0]["entity_id"]  # fmt: skip
    # Temporal loses the entity, its turn and the supervisor (terminated with no cleanup).
    for wid in (entity, turn_id, names.supervisor_id(name, 1)):
        await instance.client.get_workflow_handle(wid).terminate("test: Temporal lost it")
    outcome = await rearm(
        instance.pool,
        instance.client,
        instance.deliverer.workflow_queue,
        outbox=instance.deliverer.outbox,
    )
    assert "1 lost turn(s) ended" in outcome and "1 stream(s) to redeliver" in outcome
    ended = await query(instance.pool, "SELECT status FROM turns WHERE id = %s", turn_id)
    assert ended[0]["status"] == names.TURN_CANCELLED
    assert (await supervisor_status(instance, name)).state == names.GEN_RUNNING

    async def consumed_once() -> bool:
        q = """SELECT d.status FROM bus_deliveries d JOIN bus_streams s USING (stream_key)
               WHERE s.employee = %s AND s.lane = 'worker' AND d.type = 'msg'"""
        return [r["status"] for r in await query(instance.pool, q, name)] == ["done"]

    # The relay sends the input again to a new entity run, whose turn sleeps 5 s again.
    await wait_for(consumed_once, timeout=60, what="the input consumed by a new turn")
    turns = await query(instance.pool, "SELECT status FROM turns WHERE employee = %s "
                        "AND thread <> 'main' ORDER BY n", name)  # fmt: skip
    assert [t["status"] for t in turns] == ["cancelled", "done"]
    await slots_given_back(instance, name)


async def test_a_tick_while_its_triggers_turn_runs_is_skipped_with_a_reason(
    instance: Instance,
) -> None:
    """`on_busy: skip` (the default): a cron tick arriving while a turn from the same trigger
    runs is settled without a turn, with the reason."""

    def slow_cron(name: str) -> str:
        return local_spec(name, """    - {kind: cron, name: hourly, schedule: "0 * * * *",
       text: "hourly chore\\nsleep: 3\\ncall: lookup {}"}
""")  # fmt: skip

    name = await new_employee(instance, slow_cron)
    await applied(instance, name, "start")
    schedule = instance.client.get_schedule_handle(names.schedule_id(name, 1, "hourly"))
    await wait_for(lambda: described(schedule), timeout=30, what="the Schedule created")
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)

    async def fire(at: datetime) -> None:
        """The schedule's action for the nominal time `at` (a backfill of that hour)."""
        window = ScheduleBackfill(at - timedelta(minutes=1), at + timedelta(minutes=1),
                                  overlap=ScheduleOverlapPolicy.ALLOW_ALL)  # fmt: skip
        await schedule.backfill(window)

    await fire(hour - timedelta(hours=2))

    async def running() -> str | None:
        q = "SELECT id FROM turns WHERE employee = %s AND status = 'running'"
        rows = await query(instance.pool, q, name)
        return rows[0]["id"] if rows else None

    turn_id = await wait_for(running, timeout=20, what="the cron turn running")
    await fire(hour - timedelta(hours=1))  # the next scheduled time, while that turn runs

    async def settled_ticks() -> list[dict[str, Any]] | None:
        q = "SELECT seq, status, reason FROM bus_deliveries WHERE type = %s ORDER BY seq"
        rows = await query(instance.pool, q, names.TYPE_TRIGGER_CRON)
        return rows if len(rows) == 2 and all(r["status"] == "done" for r in rows) else None

    first, second = await wait_for(settled_ticks, timeout=30, what="both ticks settled")
    assert first["reason"] is None
    assert second["reason"] == f"skipped: hourly was running (turn {turn_id})"
    turns = await query(instance.pool, "SELECT status FROM turns WHERE employee = %s", name)
    assert [t["status"] for t in turns] == ["done"]


async def test_admission_refuses_a_paused_or_retired_generation(instance: Instance) -> None:
    """A Reset landing between the relay's generation check and its call is caught here: the
    entity is told `retired` and closes without a turn; paused, it waits for `wake`."""
    name = await new_employee(instance)
    await applied(instance, name, "start")
    req = AdmitRequest(name, 1, "front", "main", names.stream_key(name, 1, "talk", "main"), 1)
    async with instance.pool.connection() as conn:
        await intents.request(conn, name, names.INTENT_STOP)
        paused = (await admission.acquire(conn, req, SchedConfig())).admission
        await intents.request(conn, name, names.INTENT_RESET)
        retired = (await admission.acquire(conn, req, SchedConfig())).admission
    assert (paused.granted, paused.gate) == (False, names.GEN_PAUSED)
    assert (retired.granted, retired.gate) == (False, names.GEN_RETIRED)


async def test_the_supervisor_continues_as_new_carrying_its_control(instance: Instance) -> None:
    """At its Update limit (1,800; 2 here) the supervisor continues as new with the same
    control block, and a stale revision is still refused by the new run."""
    name = await new_employee(instance)
    await applied(instance, name, "start")
    sid = names.supervisor_id(name, 1)
    await instance.client.get_workflow_handle(sid).terminate("test: replaced by a short roll")
    await instance.client.start_workflow(
        names.WF_SUPERVISOR,
        SupervisorInput(name, 1, Control("running", 1), continued=True, roll_after=2),
        id=sid, task_queue=instance.deliverer.workflow_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        priority=Priority(priority_key=names.SUPERVISOR_PRIORITY, fairness_key=name),
    )  # fmt: skip
    handle = instance.client.get_workflow_handle(sid)
    first = (await handle.describe()).run_id
    for revision, usd in ((2, 1), (3, 2)):
        await handle.execute_update(
            names.UPDATE_SET_LIMITS, SetLimits({"daily_usd": usd}, revision)
        )

    async def rolled() -> str | None:
        run = (await handle.describe()).run_id
        return run if run != first else None

    await wait_for(rolled, timeout=15, what="the supervisor continued as new")
    status = await supervisor_status(instance, name)
    assert (status.state, status.revision, status.limits, status.updates) == (
        "running", 3, {"daily_usd": 2.0}, 0,
    )  # fmt: skip
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(names.UPDATE_SET_LIMITS, SetLimits({"daily_usd": 9}, 3))
    assert "stale revision 3" in str(refused.value.cause)
