"""Admission on PostgreSQL (SPEC §9): the reserved owner slot, waiters offered freed slots
(below-floor classes first, employees in turn), the gates, forgotten waiters, and priority
inheritance on the real stack."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import apply_and_start
from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.common import Priority
from test_router import query
from test_turns import Instance, instance, step_started  # noqa: F401 (`instance` is a fixture)

from eventos import names
from eventos.contracts import Admission, AdmitRequest, DeliveryItem, OfferInputs, TurnInput
from eventos.db import Conn
from eventos.delivery.routing import entity_id
from eventos.scheduling import admission
from eventos.scheduling.admission import Answer
from eventos.scheduling.policy import SchedConfig
from eventos.testing import wait_for
from eventos.workers.activities import DbActivities

SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: NAME}
spec:
  agents:
    - name: front
      model: {provider: local, name: echo}
  triggers:
    - {kind: chat}
"""
ROOMY = {k: 10 for k in names.CLASSES}


async def employees(pool: AsyncConnectionPool[Conn], *names_: str) -> None:
    await apply_and_start(pool, "---\n".join(SPEC.replace("NAME", n) for n in names_))


async def ask(pool: AsyncConnectionPool[Conn], cfg: SchedConfig, employee: str, thread: str,
              klass: int, lane: str = names.LANE_WORKER) -> Answer:  # fmt: skip
    """The entity of (employee, lane, thread) asks for a slot for a turn of `klass`."""
    key = names.stream_key(employee, 1, lane, thread)
    wf = entity_id(employee, 1, lane, thread)
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO bus_streams (stream_key, employee, generation, lane, thread, entity_id)"
            " VALUES (%s, %s, 1, %s, %s, %s) ON CONFLICT DO NOTHING",
            (key, employee, lane, thread, wf),
        )
        req = AdmitRequest(employee, 1, "front", thread, key, klass, workflow_id=wf)
        return await admission.acquire(conn, req, cfg)


async def release(pool: AsyncConnectionPool[Conn], cfg: SchedConfig, answer: Answer) -> list[str]:
    async with pool.connection() as conn:
        changed, wake = await admission.release(conn, cfg, answer.admission.turn_id, "done")
    assert changed
    return wake


def granted(answer: Answer) -> bool:
    return answer.admission.granted


async def test_the_reserved_owner_slot_is_always_available(pool: AsyncConnectionPool[Conn]) -> None:
    """Capacity and the employee's cap are both used up by background work: the owner still
    gets a turn at once (the reserved slot), and only one at a time."""
    await employees(pool, "busy")
    cfg = SchedConfig(capacity=4, class_max=ROOMY)
    for i in range(4):
        assert granted(await ask(pool, cfg, "busy", f"bg{i}", names.C4_BACKGROUND))
    assert not granted(await ask(pool, cfg, "busy", "bg9", names.C4_BACKGROUND))
    owner = await ask(pool, cfg, "busy", "main", names.C1_OWNER, lane=names.LANE_TALK)
    assert granted(owner) and owner.admission.reserved
    second = await ask(pool, cfg, "busy", "other", names.C1_OWNER, lane=names.LANE_TALK)
    assert not granted(second)  # the reserved slot is taken: this one queues like any other
    await release(pool, cfg, owner)
    again = await ask(pool, cfg, "busy", "main", names.C1_OWNER, lane=names.LANE_TALK)
    assert granted(again) and again.admission.reserved


async def test_a_freed_slot_goes_to_the_class_below_its_floor_and_is_kept_for_it(
    pool: AsyncConnectionPool[Conn],
) -> None:
    await employees(pool, "cust", "bg", "late")
    cfg = SchedConfig(capacity=2, class_max=ROOMY)
    first = await ask(pool, cfg, "cust", "t1", names.C2_CUSTOMER)
    assert granted(first) and granted(await ask(pool, cfg, "cust", "t2", names.C2_CUSTOMER))
    assert not granted(await ask(pool, cfg, "bg", "main", names.C4_BACKGROUND))
    assert not granted(await ask(pool, cfg, "cust", "t3", names.C2_CUSTOMER))
    # C2 holds 100% of admissions, C4 none: the freed slot is offered to C4 and it is woken.
    assert await release(pool, cfg, first) == [entity_id("bg", 1, names.LANE_WORKER, "main")]
    newcomer = await ask(pool, cfg, "late", "t1", names.C2_CUSTOMER)
    assert not granted(newcomer)  # the slot is kept for the woken entity
    background = await ask(pool, cfg, "bg", "main", names.C4_BACKGROUND)
    assert granted(background) and background.admission.n == 1
    q = "SELECT id, admission_wait_s FROM turns ORDER BY started_at"
    waits = {r["id"]: r["admission_wait_s"] for r in await query(pool, q)}
    assert waits[first.admission.turn_id] == 0.0  # granted at its first ask
    assert waits[background.admission.turn_id] > 0.0  # queued until the release
    waiting = await query(pool, "SELECT stream_key FROM sched_waiters ORDER BY requested_at")
    assert [w["stream_key"] for w in waiting] == ["cust/g1/worker/t3", "late/g1/worker/t1"]


async def test_employees_take_turns_within_a_class(pool: AsyncConnectionPool[Conn]) -> None:
    await employees(pool, "a", "b", "c")
    cfg = SchedConfig(capacity=1, class_max=ROOMY)
    running = await ask(pool, cfg, "c", "x", names.C3_INTERNAL)
    assert granted(running)
    for i in range(3):
        assert not granted(await ask(pool, cfg, "a", f"a{i}", names.C3_INTERNAL))
    assert not granted(await ask(pool, cfg, "b", "b0", names.C3_INTERNAL))
    served = []
    for _ in range(3):
        (woken,) = await release(pool, cfg, running)
        served.append(woken.split("-")[1])
        thread = woken.rsplit("-", 1)[1]
        running = await ask(pool, cfg, woken.split("-")[1], thread, names.C3_INTERNAL)
        assert granted(running)
    assert served == ["a", "b", "a"]  # a asked first, then b gets its turn before a's second


async def test_budget_and_pause_gates(pool: AsyncConnectionPool[Conn]) -> None:
    await employees(pool, "spender")
    cfg = SchedConfig(capacity=8, class_max=ROOMY)
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO employee_budgets (employee, daily_usd, timezone, offset_s, period_start,"
            " period_end, state) VALUES ('spender', 1, 'UTC', 0, now(), now() + interval '1 day',"
            " 'high')"
        )
    held = await ask(pool, cfg, "spender", "cron", names.C4_BACKGROUND)
    assert (held.admission.granted, held.admission.gate) == (False, names.GATE_BUDGET)
    assert granted(await ask(pool, cfg, "spender", "t1", names.C2_CUSTOMER))
    async with pool.connection() as conn:  # at `max` every class waits, the owner's too
        await conn.execute("UPDATE employee_budgets SET state = 'max'")
    owner = await ask(pool, cfg, "spender", "main", names.C1_OWNER, lane=names.LANE_TALK)
    assert (owner.admission.granted, owner.admission.gate) == (False, names.GATE_BUDGET)
    async with pool.connection() as conn:
        await conn.execute("UPDATE generations SET state = 'paused' WHERE employee = 'spender'")
    paused = await ask(pool, cfg, "spender", "t2", names.C2_CUSTOMER)
    assert (paused.admission.granted, paused.admission.gate) == (False, names.GEN_PAUSED)
    assert await query(pool, "SELECT * FROM sched_waiters") == []  # gated askers do not wait


async def test_lapsed_offers_and_silent_waiters(pool: AsyncConnectionPool[Conn]) -> None:
    """An offer not taken lapses (the slot goes to the next waiter); a waiter that stopped
    asking (its entity is gone) is forgotten."""
    await employees(pool, "x", "y")
    cfg = SchedConfig(capacity=1, class_max=ROOMY)
    running = await ask(pool, cfg, "x", "run", names.C2_CUSTOMER)
    assert not granted(await ask(pool, cfg, "y", "gone", names.C2_CUSTOMER))
    assert not granted(await ask(pool, cfg, "x", "next", names.C2_CUSTOMER))
    # y was never served in C2, x just was: y is offered the slot.
    assert await release(pool, cfg, running) == [entity_id("y", 1, names.LANE_WORKER, "gone")]
    assert not granted(await ask(pool, cfg, "x", "next", names.C2_CUSTOMER))
    await age(pool, "y/g1/worker/gone", offered_s=admission.OFFER_TTL_S + 1,
              asked_s=admission.STALE_WAITER_S + 1)  # fmt: skip
    # x asks again: y's offer lapsed and y is forgotten, so x gets the slot.
    assert granted(await ask(pool, cfg, "x", "next", names.C2_CUSTOMER))
    assert await query(pool, "SELECT * FROM sched_waiters") == []


async def age(pool: AsyncConnectionPool[Conn], stream_key: str, *, offered_s: float,
              asked_s: float) -> None:  # fmt: skip
    params: dict[str, Any] = {"k": stream_key, "o": offered_s, "a": asked_s}
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE sched_waiters SET offered_at = now() - make_interval(secs => %(o)s),"
            " asked_at = now() - make_interval(secs => %(a)s) WHERE stream_key = %(k)s",
            params,
        )


async def test_a_merged_higher_class_input_moves_the_turn_up(instance: Instance) -> None:
    """Priority inheritance: a C1 input merged (B1) into a running C4 turn moves its next
    steps to `llm-c1` with priority 1 and upgrades its admission lease to C1."""
    name = instance.name
    answer = await ask(instance.pool, SchedConfig(), name, "chores", names.C4_BACKGROUND)
    tid = answer.admission.turn_id
    key = names.stream_key(name, 1, names.LANE_WORKER, "chores")
    route = {"agent": "front", "kind": "grpc", "trigger": "chores"}

    def item(seq: int, klass: int, text: str) -> DeliveryItem:
        return DeliveryItem(seq, seq, klass, "msg", route, f"chain-{seq}", 0, 10,
                            payload={"data": {"text": text}})  # fmt: skip

    turn = TurnInput(tid, name, 1, "front", "chores", key, names.C4_BACKGROUND, route,
                     [item(1, names.C4_BACKGROUND, "chore\nsleep: 2\ncall: lookup {}")])  # fmt: skip
    handle = await instance.client.start_workflow(
        names.WF_TURN, turn, id=tid, task_queue=instance.relay.task_queue,
        priority=Priority(priority_key=names.C4_BACKGROUND, fairness_key=name),
    )  # fmt: skip
    await step_started(instance, tid)
    await handle.signal(names.SIGNAL_OFFER, OfferInputs([item(2, names.C1_OWNER, "urgent")]))
    await handle.result()
    queues = [
        (e.activity_task_scheduled_event_attributes.task_queue.name,
         e.activity_task_scheduled_event_attributes.priority.priority_key)
        async for e in handle.fetch_history_events()
        if e.HasField("activity_task_scheduled_event_attributes")
    ]  # fmt: skip
    c4 = names.queue_for("llm-c4", instance.relay.task_queue)
    c1 = names.queue_for("llm-c1", instance.relay.task_queue)
    # Step 0 before the merge, its tool call (on the workflow queue, in the turn's class), then
    # step 1 after it.
    assert queues == [(c4, 4), (instance.relay.task_queue, 4), (c1, 1)]
    (lease,) = await query(instance.pool, "SELECT class FROM sched_leases WHERE turn_id = %s", tid)
    assert lease == {"class": names.C1_OWNER}


LOST: list[str] = []  # the turns whose grant reached the database but not the entity


class LossyAdmission:
    """Defined in a class, so Temporal reads `admit_turn` as a method (its first parameter
    is the activities object, not an argument)."""

    @activity.defn(name=names.ACT_ADMIT)
    async def admit_turn(self, req: AdmitRequest) -> Admission:  # self: the DbActivities
        """The real admission commits; the first grant's answer is then lost, as when the
        connection drops after the commit or the worker dies before its workflow task
        completes (the fault run found the latter: a retried entity task asked again)."""
        answer = await REAL_ADMIT(self, req)  # type: ignore[arg-type]
        if answer.granted and not LOST:
            LOST.append(answer.turn_id)
            raise RuntimeError("the grant committed, its answer was lost")
        return answer


REAL_ADMIT = DbActivities.admit_turn


@pytest.fixture
def lossy_admission(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set before `instance` builds its workers (fixtures are set up in parameter order)."""
    LOST.clear()
    monkeypatch.setattr(DbActivities, "admit_turn", LossyAdmission.admit_turn)


async def test_an_ask_repeated_after_its_grant_was_lost_gets_the_same_turn(
    lossy_admission: None, instance: Instance
) -> None:
    """The entity asks again with the same ask: the turn granted before runs, and no second
    turn holds a slot that nothing will ever give back (the fault run saw 14 such turns
    block their employees until the relay's next boot)."""
    message = await instance.chat("hello")
    assert "hello" in await instance.reply(message)
    turns = await query(instance.pool, "SELECT id, status FROM turns WHERE employee = %s",
                        instance.name)  # fmt: skip
    assert turns == [{"id": LOST[0], "status": "done"}]

    async def slots_back() -> bool:  # the entity gives the slot back after the turn
        return await query(instance.pool, "SELECT turn_id FROM sched_leases") == []

    await wait_for(slots_back, timeout=30, what="every slot given back")
