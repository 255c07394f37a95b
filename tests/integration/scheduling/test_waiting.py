"""Why an input waits, each gate produced for real: the router not run yet, the relay's next
pass, a quarantine and a timed backoff (holds another part sets), a relay whose Temporal is
stopped, and on the whole stack (relay, dev server, admission) a debounce, Stop, the budget, a
full window behind a stuck turn, a class's slots filled, another class below its floor, a turn
parked by a missing key, and a storm's open breaker; a backoff reached by turns that really
fail. Each answer's code and until. And what a conversation waiting for a slot is sent: no input
of its class until its grant hands them over, and an input of a higher class at once, which
makes it ask again."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN
from fake_openai import FakeOpenAI
from messaging_helpers import team
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType as E
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHandle
from test_admission import ask
from test_admission import employees as admission_employees
from test_budget import budgeted, chat, set_spent
from test_parking import fake, llm_endpoints, on, parked  # noqa: F401 (fixtures)
from test_restart_intensity import FAILS, dead, deliveries_of, stream_row, supervising
from test_router import append_all, driver_event, query, route_until_done
from test_storm import storm_minute
from test_supervision import applied, new_employee
from test_turns import Instance, instance, local_spec  # noqa: F401 (`instance` is a fixture)

from eventos import names
from eventos.cli import main
from eventos.db import Conn
from eventos.delivery import held
from eventos.delivery.relay import Relay
from eventos.local.ports import free_port
from eventos.runtime.temporal import TemporalConnection, wake_entities
from eventos.scheduling import admission, ledger
from eventos.scheduling.policy import SchedConfig
from eventos.settings import SupervisionSettings, TemporalSettings
from eventos.testing import wait_for

HOUR = timedelta(hours=1)


async def waiting(api: httpx.AsyncClient, name: str) -> list[dict[str, Any]]:
    r = await api.get(f"/v1/employees/{name}/waiting", params={"limit": 200})
    assert r.status_code == 200, r.text
    return r.json()["waiting"]  # type: ignore[no-any-return]


async def gate_of(api: httpx.AsyncClient, name: str, code: str, **match: Any) -> dict[str, Any]:
    """The first waiting input (matching `match`) once its gate is `code`."""

    async def found() -> dict[str, Any] | None:
        for w in await waiting(api, name):
            if all(w.get(k) == v for k, v in match.items()):
                return w if w["gate"]["code"] == code else None
        return None

    return await wait_for(found, timeout=60, interval=0.2, what=f"an input of {name} at {code}")


def until(w: dict[str, Any]) -> datetime | None:
    raw = w["gate"]["until"]
    return datetime.fromisoformat(raw) if raw else None


@pytest.fixture
async def admin(ingress_url: str) -> Any:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=30) as c:
        yield c


async def test_routing_the_relay_and_holds_set_by_other_parts(
    admin: httpx.AsyncClient, pool: AsyncConnectionPool[Conn], started: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("alice", 1)])
    w = await gate_of(admin, started, "routing")
    assert (w["status"], w["stream"], until(w)) == ("accepted", None, None)
    await route_until_done(pool)
    w = await gate_of(admin, started, "relay", seq=1)
    assert (w["status"], w["lane"], w["class"], until(w)) == ("pending", "worker", 3, None)
    assert w["thread"].startswith("t_")  # a subject's thread: a hash, never the subject

    # Any stream hold shows up by its reason, with its end when it has one (`hold_until`);
    # test_restart_intensity produces a quarantine for real and reads it here too.
    async with pool.connection() as conn:
        await conn.execute("UPDATE bus_streams SET hold_reason = 'quarantined'")
    w = await gate_of(admin, started, "quarantined", seq=1)
    assert until(w) is None and "release" in w["gate"]["text"]
    async with pool.connection() as conn:
        cur = await conn.execute("UPDATE bus_streams SET hold_reason = 'backoff', "
                                 "hold_until = now() + interval '5 minutes' RETURNING hold_until")  # fmt: skip
        end = (await cur.fetchone() or {})["hold_until"]
    w = await gate_of(admin, started, "backoff", seq=1)
    assert until(w) == end

    # eventosctl waiting: the API's answer, read back; and in words.
    where = ["--url", str(admin.base_url), "--token", ADMIN_TOKEN]
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["waiting", started, "-o", "json", *where]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [x["gate"] for x in doc["waiting"]] == [w["gate"]] and doc["more"] == 0
    assert await asyncio.to_thread(main, ["waiting", started, *where]) == 0
    out = capsys.readouterr().out
    assert "backoff" in out and end.isoformat()[:19] in out


# A backoff long enough to read while it holds (on a loaded machine too); no quarantine.
HELD_BACKOFF = SupervisionSettings(backoff_s=(120.0, 120.0, 120.0), quarantine_after=50)


@pytest.mark.parametrize("supervision_settings", [HELD_BACKOFF])
async def test_a_thread_whose_turns_fail_shows_its_backoff_and_its_end(
    instance: Instance, supervision_settings: SupervisionSettings
) -> None:
    stream_key = names.stream_key(instance.name, 1, names.LANE_TALK, names.THREAD_MAIN)
    async with supervising(instance, supervision_settings):
        # Three failed turns in ten minutes: the first input's two tries, the second's first.
        await dead(instance, await instance.chat("first breaks" + FAILS))
        await instance.chat("second breaks" + FAILS)

        async def backed_off() -> dict[str, Any] | None:
            row = await stream_row(instance, stream_key)
            return row if row["hold_reason"] == names.HOLD_BACKOFF else None

        row = await wait_for(backed_off, timeout=60, what="the thread backed off")
        later = await instance.chat("later one")

        async def routed() -> list[dict[str, Any]] | None:
            return await deliveries_of(instance, [later]) or None

        (delivery,) = await wait_for(routed, timeout=30, what="the later input routed")
        w = await gate_of(instance.api, instance.name, "backoff", seq=delivery["seq"])
    assert (w["status"], w["stream"]) == ("pending", stream_key)
    assert until(w) == row["hold_until"] == row["backoff_until"]
    assert until(w) > row["db_now"]  # still ahead when it was read: the hold is what waits


async def test_a_relay_whose_temporal_is_stopped_says_so_until_its_next_probe(
    admin: httpx.AsyncClient, pool: AsyncConnectionPool[Conn], started: str
) -> None:
    await append_all(pool, [driver_event("bob", 1)])
    await route_until_done(pool)
    stopped = TemporalSettings(address=f"127.0.0.1:{free_port()}", namespace="default")
    relay = Relay(pool, TemporalConnection(stopped), "relay-down")
    assert await relay.pass_once() == 0
    assert relay.breaker.opened
    (row,) = await query(pool, "SELECT probe_at FROM relay_breakers WHERE relay_id = 'relay-down'")
    w = await gate_of(admin, started, "temporal_unavailable", seq=1)
    assert until(w) == row["probe_at"]
    # Another relay that reached Temporal since (its breaker closed) speaks against it.
    async with pool.connection() as conn:
        await conn.execute("INSERT INTO relay_breakers (relay_id, open) VALUES ('relay-up', false)")
    await gate_of(admin, started, "relay", seq=1)
    # A relay that stopped refreshing its breaker (gone) no longer speaks for Temporal.
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM relay_breakers WHERE relay_id = 'relay-up'")
    await gate_of(admin, started, "temporal_unavailable", seq=1)
    async with pool.connection() as conn:
        await conn.execute("UPDATE relay_breakers SET updated_at = now() - interval '1 minute'")
    await gate_of(admin, started, "relay", seq=1)


async def test_a_customer_burst_waits_out_its_debounce(instance: Instance) -> None:
    name = f"c{uuid.uuid4().hex[:8]}"
    trigger = "    - {kind: telegram, account: tg-NAME, debounce: {window_s: 60, cap_s: 120}}\n"
    await instance.api.post(
        "/v1/employees", content=local_spec(name, trigger.replace("NAME", name))
    )
    await applied(instance, name, "start")
    source = f"telegram:tg-{name}"
    event = driver_event("+4915100001", 1, source, text="hi", reply_to="+4915100001")
    await append_all(instance.pool, [event])
    w = await gate_of(instance.api, name, "debounce", status="delivered")
    (d,) = await query(instance.pool, "SELECT created_at FROM bus_deliveries WHERE id = %s",
                       int(w["ref"]))  # fmt: skip
    assert until(w) == d["created_at"] + timedelta(seconds=60)
    assert w["lane"] == names.LANE_CUSTOMER and w["input"] == "Telegram message"


def two_drivers(name: str) -> str:
    return local_spec(name, f"""    - {{kind: chat}}
    - {{kind: grpc, name: ops, driver: ops-{name}, class: C3, thread_by: subject}}
    - {{kind: grpc, name: bg, driver: bg-{name}, class: C4, thread_by: subject}}
""")  # fmt: skip


async def test_a_stopped_employee_holds_its_inputs(instance: Instance) -> None:
    name = await new_employee(instance, two_drivers)
    await applied(instance, name, "start")
    await applied(instance, name, "stop")
    await append_all(instance.pool, [driver_event("x", 1, f"grpc:ops-{name}")])
    w = await gate_of(instance.api, name, "paused")
    assert until(w) is None and "stopped by the owner" in w["gate"]["text"]


async def test_background_work_waits_for_the_budget_until_the_period_ends(
    instance: Instance,
) -> None:
    name = await new_employee(instance, budgeted)
    await applied(instance, name, "start")
    async with instance.pool.connection() as conn:
        await ledger.refresh(conn, name)
    await set_spent(instance.pool, name, "0.795")
    first = await chat(instance, name, "first")
    await instance.reply(first, name=name)  # its step reserves past 80%: `high`
    await append_all(instance.pool, [driver_event("x", 1, f"grpc:bg-{name}", text="chore")])
    w = await gate_of(instance.api, name, "budget_hold", status="pending")
    (b,) = await query(instance.pool, "SELECT period_end FROM employee_budgets WHERE employee = %s",
                       name)  # fmt: skip
    assert until(w) == b["period_end"]
    assert "budget high" in w["gate"]["text"] and "of 1.00 USD" in w["gate"]["text"]


async def test_a_stuck_turn_fills_the_window_and_the_rest_waits(instance: Instance) -> None:
    name = await new_employee(instance, two_drivers)
    await applied(instance, name, "start")
    source = f"grpc:ops-{name}"
    await append_all(instance.pool, [driver_event("x", 0, source, text="sleep: 300")])
    await gate_of(instance.api, name, "in_turn", seq=1)
    await append_all(instance.pool, [driver_event("x", n, source) for n in range(1, 40)])

    async def held() -> bool:
        q = "SELECT 1 FROM bus_streams WHERE employee = %s AND hold_reason = 'window'"
        return bool(await query(instance.pool, q, name))

    await wait_for(held, timeout=60, what="the window held")
    found = await waiting(instance.api, name)
    codes = {w["seq"]: w["gate"]["code"] for w in found}
    assert {codes[s] for s in range(1, 33)} == {"in_turn"}
    assert {codes[s] for s in range(33, 41)} == {"window_full"}
    full = next(w for w in found if w["seq"] == 40)
    assert until(full) is None and "32 inputs" in full["gate"]["text"]


async def fill(pool: AsyncConnectionPool[Conn], klass: int, employees: int) -> list[str]:
    """Hold 4 slots per employee (`employees` of them) of `klass`, the employee cap each, by
    admitted turns that run nothing: the slots stay taken."""
    names_ = [f"f{uuid.uuid4().hex[:8]}" for _ in range(employees)]
    await admission_employees(pool, *names_)
    turns = []
    for employee in names_:
        for t in range(4):
            got = await ask(pool, SchedConfig(), employee, f"t{t}", klass)
            assert got.admission.granted
            turns.append(got.admission.turn_id)
    return turns


async def test_a_conversation_waits_for_a_slot_of_its_class(instance: Instance) -> None:
    held = await fill(instance.pool, names.C4_BACKGROUND, 1)  # C4's ceiling is 4
    name = await new_employee(instance, two_drivers)
    await applied(instance, name, "start")
    await append_all(instance.pool, [driver_event("x", 1, f"grpc:bg-{name}")])
    w = await gate_of(instance.api, name, "class_slot", status="delivered")
    assert until(w) is None
    text = w["gate"]["text"]
    assert "every C4 slot is taken (4)" in text and "position 1 of 1 waiting in C4" in text
    assert held[0] in text  # what runs


async def waiting_entity(instance: Instance, source: str) -> tuple[WorkflowHandle[Any, Any], str]:
    """A new employee whose first input, from `source`'s driver (`bg` or `ops`), waits for a
    slot: its entity's handle and the employee's name."""
    name = await new_employee(instance, two_drivers)
    await applied(instance, name, "start")
    await append_all(instance.pool, [driver_event("x", 1, f"grpc:{source}-{name}")])
    await gate_of(instance.api, name, "class_slot", status="delivered")
    (row,) = await query(instance.pool, "SELECT entity_id FROM bus_streams WHERE employee = %s",
                         name)  # fmt: skip
    return instance.client.get_workflow_handle(row["entity_id"]), name


async def until_turn_start(entity: WorkflowHandle[Any, Any]) -> list[HistoryEvent]:
    """The entity's history up to its first turn's start, once it started one."""

    async def started() -> list[HistoryEvent] | None:
        events = list((await entity.fetch_history()).events)
        kinds = [e.event_type for e in events]
        child = E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        return events[: kinds.index(child) + 1] if child in kinds else None

    return await wait_for(started, timeout=60, what="the entity's first turn")


def asks(events: list[HistoryEvent]) -> int:
    """Admission asks: the local activities of an entity that has not run a turn yet."""
    return sum(e.event_type == E.EVENT_TYPE_MARKER_RECORDED
               and e.marker_recorded_event_attributes.marker_name != "core_patch"
               for e in events)  # fmt: skip


async def stream_inputs(pool: AsyncConnectionPool[Conn], name: str) -> dict[int, str]:
    """The statuses of the employee's inputs by seq (it has one stream here)."""
    rows = await query(pool, "SELECT d.seq, d.status FROM bus_deliveries d JOIN bus_streams s "
                       "USING (stream_key) WHERE s.employee = %s ORDER BY d.seq", name)  # fmt: skip
    return {int(r["seq"]): str(r["status"]) for r in rows}


def signals(events: list[HistoryEvent]) -> int:
    return sum(e.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED for e in events)


async def test_a_waiting_conversation_is_sent_nothing_until_its_grant_hands_the_inputs_over(
    instance: Instance,
) -> None:
    """Inputs of its class that come while a conversation waits for a slot cost it no Signal
    (nor an ask: each would take the instance-wide lock): the relay leaves them pending, the
    waiting list says they wait for the slot, and the `wake` of the slot's release makes the
    one ask whose grant carries them, so its turn covers all of them."""
    held = await fill(instance.pool, names.C4_BACKGROUND, 1)
    entity, name = await waiting_entity(instance, "bg")
    await append_all(instance.pool, [driver_event("x", n, f"grpc:bg-{name}") for n in range(2, 6)])
    await route_until_done(instance.pool)
    # A relay pass of our own, beside the instance's: it leaves them to the grant as well.
    relay = Relay(instance.pool, instance.relay.temporal, "relay-look",
                  task_queue=instance.relay.task_queue)  # fmt: skip
    await relay.pass_once()
    assert await stream_inputs(instance.pool, name) == {
        1: "delivered", 2: "pending", 3: "pending", 4: "pending", 5: "pending"}  # fmt: skip
    w = await gate_of(instance.api, name, "class_slot", status="pending")
    assert "every C4 slot is taken (4)" in w["gate"]["text"]
    async with instance.pool.connection() as conn:
        _, wake = await admission.release(conn, SchedConfig(), held[0], names.TURN_DONE)
    assert wake == [entity.id]
    await wake_entities(instance.client, wake)
    events = await until_turn_start(entity)
    assert asks(events) == 2  # the first input's, and the wake's
    assert signals(events) == 2  # the first input's `deliver` and the `wake`: none of 2-5
    child = events[-1].start_child_workflow_execution_initiated_event_attributes
    inputs = json.loads(child.input.payloads[0].data)["inputs"]
    assert [i["payload"]["data"]["n"] for i in inputs] == [1, 2, 3, 4, 5]
    assert set((await stream_inputs(instance.pool, name)).values()) <= {"delivered", "consumed"}


async def test_a_grant_asked_again_hands_over_the_same_inputs(instance: Instance) -> None:
    """A grant's answer lost and asked again reads the inputs it took the first time (they
    are above the entity's applied seq still), and takes no more than the window's room."""
    await fill(instance.pool, names.C4_BACKGROUND, 1)
    _, name = await waiting_entity(instance, "bg")
    await append_all(instance.pool, [driver_event("x", n, f"grpc:bg-{name}") for n in range(2, 40)])
    await route_until_done(instance.pool)
    (row,) = await query(instance.pool, "SELECT stream_key FROM bus_streams WHERE employee = %s",
                         name)  # fmt: skip
    async with instance.pool.connection() as conn:
        first = await held.take(conn, row["stream_key"], 1)
        again = await held.take(conn, row["stream_key"], 1)
        after = await held.take(conn, row["stream_key"], first[-1].seq)
    assert [i.seq for i in first] == [i.seq for i in again] == list(range(2, 18))  # one batch
    assert [i.seq for i in after] == list(range(18, 33))  # the window's 32 with seq 1
    statuses = await stream_inputs(instance.pool, name)
    assert [s for s, v in statuses.items() if v == "delivered"] == list(range(1, 33))
    (stream,) = await query(instance.pool, "SELECT delivered_seq, top_pending_class FROM "
                            "bus_streams WHERE employee = %s", name)  # fmt: skip
    assert stream == {"delivered_seq": 32, "top_pending_class": names.C4_BACKGROUND}


async def test_a_higher_class_input_makes_a_waiting_conversation_ask_at_once(
    instance: Instance,
) -> None:
    """A C3 input on the thread of a C4 input waiting for a slot: the entity asks again for C3
    when the input arrives, not when its ask timer fires, and the C3 turn runs while C4's
    slots stay full."""
    await fill(instance.pool, names.C4_BACKGROUND, 1)
    entity, name = await waiting_entity(instance, "bg")
    await append_all(instance.pool, [driver_event("x", 2, f"grpc:ops-{name}")])
    events = await until_turn_start(entity)
    assert asks(events) == 2
    assert not [e for e in events if e.event_type == E.EVENT_TYPE_TIMER_FIRED]
    child = events[-1].start_child_workflow_execution_initiated_event_attributes
    assert json.loads(child.input.payloads[0].data)["klass"] == names.C3_INTERNAL


async def test_a_class_above_its_floor_waits_while_one_below_goes_first(
    instance: Instance,
) -> None:
    """The instance is full (24: 8 C1 and 16 C2 turns); C3 and C4 wait, both below their
    floors (15% of the admitted turns): C3 goes first, C4 waits for it."""
    await fill(instance.pool, names.C1_OWNER, 2)
    await fill(instance.pool, names.C2_CUSTOMER, 4)
    name = await new_employee(instance, two_drivers)
    await applied(instance, name, "start")
    await append_all(instance.pool, [driver_event("a", 1, f"grpc:ops-{name}"),
                                     driver_event("b", 1, f"grpc:bg-{name}")])  # fmt: skip
    c4 = await gate_of(instance.api, name, "class_floor", **{"class": 4})
    assert until(c4) is None and "C3 is below its floor share (15%)" in c4["gate"]["text"]
    c3 = await gate_of(instance.api, name, "class_slot", **{"class": 3})
    assert "every slot of the instance is taken (24)" in c3["gate"]["text"]


async def test_a_turn_parked_by_a_missing_key_says_when_it_asks_again(
    instance: Instance, fake: FakeOpenAI
) -> None:
    name = await new_employee(instance, on(fake))
    await applied(instance, name, "start")
    await chat(instance, name, "hello")
    row = await parked(instance, name, "ProviderCredentialMissing")
    w = await gate_of(instance.api, name, "parked", status="delivered")
    (lease,) = await query(instance.pool, "SELECT suspended_at FROM sched_leases WHERE turn_id = %s",
                           row["turn_id"])  # fmt: skip
    assert until(w) == lease["suspended_at"] + timedelta(minutes=15)
    assert "ProviderCredentialMissing" in w["gate"]["text"]


async def test_a_hot_edge_with_an_open_breaker_collects_a_digest(
    admin: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    a, b = await team(pool, "a", "b")
    for minute in range(3):  # the storm test's setup: 40 a minute against 10 a minute
        await storm_minute(pool, a, b, minute, 40, minute * 40)
    w = await gate_of(admin, b, "breaker_open", status="digest")
    (digest,) = await query(pool, "SELECT due_at, count, thread FROM storm_digests "
                            "WHERE sender = %s", a)  # fmt: skip
    assert until(w) == digest["due_at"]
    assert digest["thread"] == names.peer_thread(a, "talk", "main")  # the origin's own thread
    assert w["thread"] == digest["thread"] and f"{digest['count']} messages from {a}" in w["input"]
