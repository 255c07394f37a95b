"""Alarms and follow-ups (SPEC §10) on real PostgreSQL, and through the whole in-process stack on
the real dev server: the tools (set, list, cancel, refusals, the 500 cap), `fire_due` (late with
a note, missed past `skip_after` with an attention item, repeats), follow-ups cancelled by an
inbound message in the routing transaction, deadlines of other subsystems (create_deadline,
cancel_by_ref, a hooked ref settled by its owner), and alarms fired by the supervisor's one timer."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from conftest import apply_and_start
from psycopg_pool import AsyncConnectionPool
from temporalio.common import Priority, WorkflowIDReusePolicy
from test_router import append_all, driver_event, query, route_until_done
from test_supervision import applied, supervisor_status
from test_turns import Instance, instance, transcript, transcripts  # noqa: F401 (the in-process stack fixture)

from eventos import names
from eventos.alarms import activity as alarm_activity
from eventos.alarms import store
from eventos.alarms import store as alarms
from eventos.contracts import Control, SetLimits, SupervisorInput, ToolCallInput
from eventos.db import Conn
from eventos.employees import lifecycle
from eventos.settings import AlarmSettings, SecretStore
from eventos.testing import wait_for
from eventos.tools import alarms as alarm_tools
from eventos.tools.runner import ToolRunner

TOOLS = "[set_alarm, cancel_alarm, list_alarms]"


@pytest.fixture(autouse=True)
def short_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeats every second in these tests (the workers read it when the fixture builds them)."""
    monkeypatch.setenv("EVENTOS_ALARMS_MIN_EVERY_S", "1")


def spec(name: str) -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  timezone: Europe/Berlin
  agents:
    - name: front
      model: {{provider: local, name: scripted}}
      tools: {TOOLS}
  triggers:
    - {{kind: chat}}
    - {{kind: grpc, driver: drv-{name}, thread_by: subject}}
"""


@pytest.fixture
async def employee(pool: AsyncConnectionPool[Conn]) -> str:
    name = f"a{uuid.uuid4().hex[:8]}"
    await apply_and_start(pool, spec(name))
    return name


def call(employee: str, name: str, args: dict[str, Any], *, lane: str = "talk",
         thread: str = "main", call_id: str | None = None) -> ToolCallInput:  # fmt: skip
    turn = f"turn-conv-{employee}-g1-{lane}-{thread}-1"
    return ToolCallInput(employee, 1, "front", thread, lane, f"{employee}/g1/{lane}/{thread}",
                         turn, call_id or f"call_{uuid.uuid4().hex[:12]}", name,
                         json.dumps(args), 1, {"kind": "chat", "session": "owner"}, "chain-7", 2,
                         ["other"])  # fmt: skip


async def run(pool: AsyncConnectionPool[Conn], c: ToolCallInput,
              min_every_s: int = 60) -> tuple[str, dict[str, Any]]:  # fmt: skip
    settings = {alarm_tools.SETTINGS_KEY: AlarmSettings(min_every_s=min_every_s)}
    result = await ToolRunner(pool, SecretStore(env={}), settings).run(c)
    return result.outcome, json.loads(result.content)


async def alarm_rows(pool: AsyncConnectionPool[Conn], employee: str) -> list[dict[str, Any]]:
    return await query(pool, "SELECT * FROM alarms WHERE employee = %s ORDER BY due_at", employee)


async def fired_inputs(pool: AsyncConnectionPool[Conn], employee: str) -> list[dict[str, Any]]:
    return await query(pool, "SELECT dedupe_key, type, envelope, hop, chain_id, class, status "
                             "FROM bus_ingress WHERE source_key = %s ORDER BY id",
                       f"alarm:{employee}")  # fmt: skip


async def past_alarm(pool: AsyncConnectionPool[Conn], employee: str, text: str, late_s: float,
                     **kw: Any) -> str:  # fmt: skip
    """An alarm that was due `late_s` ago, as if the supervisor had been down meanwhile."""
    aid = f"al_{uuid.uuid4().hex[:16]}"
    due = datetime.now(UTC) - timedelta(seconds=late_s)
    async with pool.connection() as conn, conn.transaction():
        await store.create(conn, store.NewAlarm(
            id=aid, employee=employee, generation=1, lane="talk", thread="main",
            route={"kind": "chat", "session": "owner", "audience": "owner", "reply": True},
            agent="front", text=text, due_at=due, chain_id="chain-late", **kw))  # fmt: skip
    return aid


async def fire(pool: AsyncConnectionPool[Conn], employee: str) -> store.Fired:
    async with pool.connection() as conn:
        return await store.fire_due(conn, employee, 1, "Europe/Berlin")


# --- the tools, on PostgreSQL ---------------------------------------------------------------


async def test_set_list_and_cancel_own_alarms(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    c = call(employee, "set_alarm", {"text": "call the bank", "in_s": 600})
    outcome, first = await run(pool, c)
    assert outcome == names.TOOL_OK and first["id"] == store.alarm_id(c.turn_id, c.call_id)
    assert await run(pool, c) == (outcome, first)  # a retried call: the same alarm, one row
    outcome, second = await run(pool, call(employee, "set_alarm", {
        "text": "standup", "at": "2099-01-01T09:00:00+01:00"}))  # fmt: skip
    assert outcome == names.TOOL_REFUSED and "more than a year" in second["error"]
    soon = (datetime.now(UTC) + timedelta(minutes=5)).astimezone().isoformat()
    outcome, second = await run(pool, call(employee, "set_alarm", {"text": "standup", "at": soon}))
    assert outcome == names.TOOL_OK
    assert datetime.fromisoformat(second["due_at"]) == datetime.fromisoformat(soon)

    _, listed = await run(pool, call(employee, "list_alarms", {}))
    assert [(a["id"], a["text"], a["status"]) for a in listed["alarms"]] == [
        (second["id"], "standup", "scheduled"), (first["id"], "call the bank", "scheduled")]  # fmt: skip
    (row, _) = await alarm_rows(pool, employee)
    assert (row["lane"], row["thread"], row["chain_id"], row["hop"], row["path"]) == (
        "talk", "main", "chain-7", 2, ["other"])  # the setting turn's context (I8)  # fmt: skip

    assert await run(pool, call(employee, "cancel_alarm", {"id": first["id"]})) == (
        names.TOOL_OK, {"id": first["id"], "status": "cancelled"})  # fmt: skip
    assert await run(pool, call(employee, "cancel_alarm", {"id": first["id"]})) == (
        names.TOOL_OK, {"id": first["id"], "status": "cancelled"})  # nothing left to cancel  # fmt: skip
    _, listed = await run(pool, call(employee, "list_alarms", {}))
    assert [a["status"] for a in listed["alarms"]] == ["scheduled", "cancelled"]

    other = f"a{uuid.uuid4().hex[:8]}"
    await apply_and_start(pool, spec(other))
    outcome, refused = await run(pool, call(other, "cancel_alarm", {"id": second["id"]}))
    assert outcome == names.TOOL_REFUSED and "you have no alarm" in refused["error"]
    assert (await run(pool, call(other, "list_alarms", {})))[1] == {"alarms": []}
    assert [r["status"] for r in await alarm_rows(pool, employee)] == ["scheduled", "cancelled"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"text": "x", "at": "2026-12-01T09:00:00"}, "has no offset: add one"),
        ({"text": "x", "at": "next tuesday"}, "not an ISO 8601 time"),
        ({"text": "x", "at": "2020-01-01T09:00:00Z"}, "is in the past"),
        ({"text": "x", "in_s": 5, "at": "2030-01-01T09:00:00Z"}, "not both"),
        ({"text": "x"}, "give exactly one of at"),
        ({"text": "x", "in_s": 0}, "in_s must be more than 0"),
        ({"text": "x", "in_s": 40_000_000}, "at most 31536000"),
        ({"text": "x", "in_s": 5, "if_late": "skip_after:10min"}, "not an ISO 8601 duration"),
        ({"text": "x", "in_s": 5, "if_late": "skip_after:P1M"}, "years and months"),
        ({"text": "x", "in_s": 5, "if_late": "never"}, "use 'fire' or 'skip_after"),
        ({"text": "x", "in_s": 5, "repeat": {"every_s": 30}}, "at least 60 seconds"),
        ({"text": "x", "in_s": 5, "repeat": {"cron": "0 25 * * *"}}, "repeat.cron '0 25 * * *'"),
        ({"text": "x", "in_s": 5, "repeat": {"cron": "0 8 * *"}}, "must have 5 fields"),
        ({"text": "x", "in_s": 5, "repeat": {"every_s": 60, "cron": "* * * * *"}},
         "invalid arguments at repeat"),
        ({"text": "x", "in_s": 5, "cancel_on": "outbound"}, "invalid arguments at cancel_on"),
        ({"in_s": 5}, "'text' is a required property"),
    ],
)  # fmt: skip
async def test_bad_alarms_are_refused_with_the_reason(
    pool: AsyncConnectionPool[Conn], employee: str, args: dict[str, Any], fragment: str
) -> None:
    outcome, out = await run(pool, call(employee, "set_alarm", args))
    assert outcome == names.TOOL_REFUSED and fragment in out["error"], out
    assert await alarm_rows(pool, employee) == []  # a refusal writes nothing


async def test_at_most_500_scheduled_alarms_per_employee(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO alarms (id, employee, generation, lane, thread, route, agent, text, "
            "due_at, chain_id) SELECT 'bulk' || n, %s, 1, 'talk', 'main', '{}', 'front', 'x', "
            "now() + interval '1 day', 'c' FROM generate_series(1, 500) n", (employee,))  # fmt: skip
        await conn.commit()
    outcome, out = await run(pool, call(employee, "set_alarm", {"text": "one more", "in_s": 60}))
    assert outcome == names.TOOL_REFUSED
    assert "500 scheduled alarms, the most it may have; cancel one first" in out["error"]
    _, listed = await run(pool, call(employee, "list_alarms", {}))
    assert len(listed["alarms"]) == store.LIST_MAX and listed["more"] == 500 - store.LIST_MAX
    assert (await run(pool, call(employee, "cancel_alarm", {"id": "bulk7"})))[0] == names.TOOL_OK
    outcome, out = await run(pool, call(employee, "set_alarm", {"text": "one more", "in_s": 60}))
    assert outcome == names.TOOL_OK, out


# --- fire_due, on PostgreSQL ----------------------------------------------------------------


async def test_a_late_alarm_fires_once_with_a_lateness_note_into_its_thread(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    on_time = await past_alarm(pool, employee, "on time", 2)
    late = await past_alarm(pool, employee, "pay rent", 300, hop=3, path=["boss"])
    done = await fire(pool, employee)
    assert (done.fired, done.missed) == (2, 0)
    assert (await fire(pool, employee)).fired == 0  # compare-and-swap: each fires once
    inputs = {r["dedupe_key"]: r for r in await fired_inputs(pool, employee)}
    assert set(inputs) == {f"alarm:{on_time}", f"alarm:{late}"}
    env = inputs[f"alarm:{late}"]["envelope"]
    data = env["data"]
    assert data["text"].startswith("pay rent\n[late: due at ") and "fired 5 min" in data["text"]
    assert data["alarm_id"] == late and 299 < data["lateness_s"] < 330
    assert datetime.fromisoformat(data["fired_at"]) > datetime.fromisoformat(data["scheduled_for"])
    assert (env["type"], env[names.ATTR_LANE], env[names.ATTR_THREAD]) == (
        "eventos.alarm.fired", "talk", "main")  # fmt: skip
    assert env[names.ATTR_ROUTE]["session"] == "owner" and env[names.ATTR_PATH] == ["boss"]
    assert (inputs[f"alarm:{late}"]["hop"], inputs[f"alarm:{late}"]["class"]) == (4, 4)
    assert inputs[f"alarm:{on_time}"]["envelope"]["data"]["text"] == "on time"  # no note
    assert {r["status"] for r in await alarm_rows(pool, employee)} == {"fired"}

    await route_until_done(pool)
    deliveries = await query(pool, "SELECT stream_key, type, route FROM bus_deliveries d "
                                   "JOIN bus_streams s USING (stream_key) WHERE s.employee = %s",
                             employee)  # fmt: skip
    assert {(d["stream_key"], d["type"]) for d in deliveries} == {
        (f"{employee}/g1/talk/main", "eventos.alarm.fired")}  # fmt: skip
    assert all(d["route"]["kind"] == "chat" for d in deliveries)  # that thread's reply route


async def test_an_alarm_past_skip_after_is_missed_with_an_attention_item(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    missed = await past_alarm(pool, employee, "standup", 600, if_late="skip_after:PT5M",
                              skip_after_s=300.0)  # fmt: skip
    kept = await past_alarm(pool, employee, "report", 120, if_late="skip_after:PT5M",
                            skip_after_s=300.0)  # fmt: skip
    done = await fire(pool, employee)
    assert (done.fired, done.missed) == (1, 1)
    status = {r["id"]: r["status"] for r in await alarm_rows(pool, employee)}
    assert status == {missed: "missed", kept: "fired"}
    assert [r["dedupe_key"] for r in await fired_inputs(pool, employee)] == [f"alarm:{kept}"]
    (item,) = await query(pool, "SELECT kind, ref, detail, state FROM attention_items "
                                "WHERE employee = %s", employee)  # fmt: skip
    assert (item["kind"], item["state"]) == ("missed_alarm", "open")
    assert item["ref"] == f"{employee}/g1/talk/main#alarm:{missed}"
    assert "skipped: 10 min" in item["detail"] and "skip_after:PT5M" in item["detail"]


async def test_a_repeating_alarm_is_scheduled_again_and_only_a_running_generation_fires(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    from eventos.alarms.timing import Repeat

    aid = await past_alarm(pool, employee, "tick", 250, repeat=Repeat(every_s=100))
    assert (await fire(pool, employee)).fired == 1
    (row,) = await alarm_rows(pool, employee)
    assert (row["status"], row["occurrence"]) == ("scheduled", 2)
    assert timedelta(0) < row["due_at"] - datetime.now(UTC) <= timedelta(seconds=50)
    (tick,) = await fired_inputs(pool, employee)
    assert tick["dedupe_key"] == f"alarm:{aid}:1" and tick["envelope"]["data"]["occurrence"] == 1

    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE alarms SET due_at = now() - interval '1 s' WHERE id = %s", (aid,)
        )
        await lifecycle.stop(conn, employee)
    assert (await fire(pool, employee)).fired == 0  # paused: it waits for Resume
    async with pool.connection() as conn:  # … and the supervisor is not brought back for it
        assert await store.next_due(conn, employee, 1) is None
    async with pool.connection() as conn:
        await lifecycle.resume(conn, employee)
    assert (await fire(pool, employee)).fired == 1
    assert [r["dedupe_key"] for r in await fired_inputs(pool, employee)] == [
        f"alarm:{aid}:1", f"alarm:{aid}:2"]  # fmt: skip
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE alarms SET due_at = now() - interval '1 s' WHERE id = %s", (aid,)
        )
        await lifecycle.reset(conn, employee)
    (row,) = await alarm_rows(pool, employee)
    assert row["status"] == "cancelled"  # a retired generation's alarms never fire
    assert (await fire(pool, employee)).fired == 0


async def deadline(pool: AsyncConnectionPool[Conn], employee: str, ref: str,
                   late_s: float) -> str:  # fmt: skip
    """A deadline of another subsystem, due `late_s` ago (set twice, as a retry would)."""
    due = datetime.now(UTC) - timedelta(seconds=late_s)
    kw: dict[str, Any] = dict(
        employee=employee, generation=1, ref=ref, due_at=due, lane="talk", thread="main",
        route={"kind": "chat", "session": "owner"}, agent="front", text="report overdue",
        chain_id="chain-dl", hop=2, path=["boss"], payload={"report": "q3"},
    )  # fmt: skip
    async with pool.connection() as conn, conn.transaction():
        did = await alarms.create_deadline(conn, **kw)
        assert await alarms.create_deadline(conn, **kw) == did  # one row
    return did


async def test_a_deadline_fires_its_payload_once_and_cancel_by_ref_settles_it(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    did = await deadline(pool, employee, "report:q3", 120)
    settled = await deadline(pool, employee, "report:q4", 120)
    async with pool.connection() as conn:
        assert await alarms.cancel_by_ref(conn, employee, "report:q4") == 1
        await conn.commit()
    done = await fire(pool, employee)
    assert (done.fired, done.missed, done.cancelled) == (1, 0, 0)  # late, never skipped
    assert (await fire(pool, employee)).fired == 0
    status = {r["id"]: (r["kind"], r["status"]) for r in await alarm_rows(pool, employee)}
    assert status == {did: ("deadline", "fired"), settled: ("deadline", "cancelled")}
    (row,) = await fired_inputs(pool, employee)
    env, data = row["envelope"], row["envelope"]["data"]
    assert (row["dedupe_key"], row["type"], row["hop"]) == (f"alarm:{did}", "eventos.deadline.due",
                                                            3)  # fmt: skip
    assert (data["report"], data["ref"], data["alarm_id"]) == ("q3", "report:q3", did)
    assert data["text"].startswith("report overdue\n[late: due at ")
    assert (env[names.ATTR_THREAD], env[names.ATTR_PATH]) == ("main", ["boss"])
    async with pool.connection() as conn:  # a settled deadline is not cancelled again
        assert await alarms.cancel_by_ref(conn, employee, "report:q3") == 0


async def test_a_hooked_deadline_whose_owner_has_nothing_open_is_cancelled(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    did = await deadline(pool, employee, "task:task_gone", 5)  # no such task (ipc's hook)
    done = await fire(pool, employee)
    assert (done.fired, done.cancelled) == (0, 1)
    assert [(r["id"], r["status"]) for r in await alarm_rows(pool, employee)] == [
        (did, "cancelled")]  # fmt: skip
    assert await fired_inputs(pool, employee) == []


# --- follow-ups, on PostgreSQL --------------------------------------------------------------


async def test_an_inbound_message_cancels_its_threads_follow_ups_as_it_is_routed(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    source = f"grpc:drv-{employee}"
    await append_all(pool, [driver_event("alice", 1, source=source)])
    await route_until_done(pool)
    (stream,) = await query(pool, "SELECT lane, thread FROM bus_streams WHERE employee = %s",
                            employee)  # fmt: skip
    lane, thread = stream["lane"], stream["thread"]
    ask = {"text": "did alice answer?", "in_s": 3600, "cancel_on": "inbound"}
    _, follow_up = await run(pool, call(employee, "set_alarm", ask, lane=lane, thread=thread))
    _, plain = await run(pool, call(employee, "set_alarm", {"text": "plain", "in_s": 3600},
                                    lane=lane, thread=thread))  # fmt: skip
    _, elsewhere = await run(pool, call(employee, "set_alarm", ask))  # the owner's chat thread
    # An alarm firing into the thread is not an inbound message: the follow-up stays.
    await past_alarm(pool, employee, "other alarm", 1)
    async with pool.connection() as conn:
        await conn.execute("UPDATE alarms SET lane = %s, thread = %s WHERE text = 'other alarm'",
                           (lane, thread))  # fmt: skip
    assert (await fire(pool, employee)).fired == 1
    await route_until_done(pool)
    assert {r["id"]: r["status"] for r in await alarm_rows(pool, employee)}[follow_up["id"]] == (
        "scheduled")  # fmt: skip

    await append_all(pool, [driver_event("bob", 2, source=source)])  # another thread
    await route_until_done(pool)
    (inbound,) = await append_all(pool, [driver_event("alice", 3, source=source)])
    await route_until_done(pool)
    status = {r["id"]: r for r in await alarm_rows(pool, employee)}
    assert status[follow_up["id"]]["status"] == "cancelled"
    assert (status[plain["id"]]["status"], status[elsewhere["id"]]["status"]) == (
        "scheduled", "scheduled")  # fmt: skip
    # In the routing transaction: its clock (now()) stamped both the delivery and the cancel.
    (routed,) = await query(pool, "SELECT routed_at FROM bus_ingress WHERE id = %s", inbound)
    assert status[follow_up["id"]]["settled_at"] == routed["routed_at"]


async def customer_threads(pool: AsyncConnectionPool[Conn], employee: str,
                           *subjects: str) -> list[tuple[str, str]]:  # fmt: skip
    """The (lane, thread) of one customer conversation per subject, as the router places a
    driver's messages (thread_by: subject)."""
    source, out = f"grpc:drv-{employee}", []
    for n, subject in enumerate(subjects):
        await append_all(pool, [driver_event(subject, n, source=source)])
        await route_until_done(pool)
        rows = await query(pool, "SELECT lane, thread FROM bus_streams WHERE employee = %s",
                           employee)  # fmt: skip
        (new,) = {(r["lane"], r["thread"]) for r in rows} - set(out)
        out.append(new)
    return out


async def test_another_customers_conversation_neither_sees_nor_cancels_an_alarm(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    """EG3, EG17: alice's alarm is not bob's to read or cancel, and an id from alice's
    conversation is answered in bob's exactly as an id that does not exist (no oracle)."""
    (a_lane, alice), (b_lane, bob) = await customer_threads(pool, employee, "alice", "bob")
    _, set_ = await run(pool, call(employee, "set_alarm", {"text": "alice's refund, 4711",
                                                           "in_s": 600},
                                   lane=a_lane, thread=alice))  # fmt: skip
    aid = set_["id"]
    # Bob's conversation lists nothing; the owner's chat (another conversation) neither.
    for lane, thread in ((b_lane, bob), ("talk", "main")):
        assert (await run(pool, call(employee, "list_alarms", {}, lane=lane,
                                     thread=thread)))[1] == {"alarms": []}  # fmt: skip
    _, mine = await run(pool, call(employee, "list_alarms", {}, lane=a_lane, thread=alice))
    assert [(a["id"], a["text"]) for a in mine["alarms"]] == [(aid, "alice's refund, 4711")]
    # Bob's cancel of alice's id is refused word for word as an unknown id is.
    unknown = "al_" + "0" * 16
    refused = await run(pool, call(employee, "cancel_alarm", {"id": aid}, lane=b_lane,
                                   thread=bob))  # fmt: skip
    as_unknown = await run(pool, call(employee, "cancel_alarm", {"id": unknown}, lane=b_lane,
                                      thread=bob))  # fmt: skip
    assert refused[0] == as_unknown[0] == names.TOOL_REFUSED
    assert refused[1]["error"] == as_unknown[1]["error"].replace(unknown, aid)
    # The alarm is untouched, and it fires into alice's conversation.
    async with pool.connection() as conn:
        await conn.execute("UPDATE alarms SET due_at = now() - interval '1 second' "
                           "WHERE id = %s", (aid,))  # fmt: skip
    assert (await fire(pool, employee)).fired == 1
    (fired,) = await fired_inputs(pool, employee)
    env = fired["envelope"]
    assert (env[names.ATTR_LANE], env[names.ATTR_THREAD]) == (a_lane, alice)
    assert env["data"]["text"] == "alice's refund, 4711"
    # Alice's own conversation cancels what is hers (the alarm fired meanwhile: its state).
    assert await run(pool, call(employee, "cancel_alarm", {"id": aid}, lane=a_lane,
                                thread=alice)) == (names.TOOL_OK,
                                                   {"id": aid, "status": "fired"})  # fmt: skip


# --- the whole stack: the supervisor's timer fires them -------------------------------------


async def supervised_employee(instance: Instance) -> str:  # noqa: F811
    """An employee with the alarm tools, started through the owner API (its supervisor runs)."""
    name = f"a{uuid.uuid4().hex[:8]}"
    r = await instance.api.post("/v1/employees", content=spec(name))
    assert r.status_code == 200, r.text
    await applied(instance, name, "start")
    return name


async def chat(instance: Instance, name: str, text: str) -> str:  # noqa: F811
    r = await instance.api.post(f"/v1/employees/{name}/chat",
                                json={"client_message_id": uuid.uuid4().hex, "text": text})  # fmt: skip
    assert r.status_code == 202, r.text
    return await instance.reply(int(r.json()["message_id"]), name=name)


async def armed(instance: Instance, name: str) -> None:  # noqa: F811
    """The supervisor has read the alarms once (its `alarms` deadline is set)."""

    async def has_deadline() -> bool:
        return "alarms" in (await supervisor_status(instance, name)).deadlines

    await wait_for(has_deadline, timeout=15, what="the supervisor's alarms deadline")


async def user_messages(instance: Instance, name: str) -> list[str]:  # noqa: F811
    messages = await transcript(instance.pool, employee=name)
    return [m["content"] for m in messages if m["role"] == "user"]


async def consumed(instance: Instance, name: str, text: str) -> str:  # noqa: F811
    """The user message an alarm's turn showed the model (it starts with the alarm's text)."""

    async def shown() -> str | None:
        return next((m for m in await user_messages(instance, name) if m.startswith(text)), None)

    return await wait_for(shown, timeout=30, what=f"the alarm {text!r} shown to the model")


async def test_an_alarm_set_in_the_owners_chat_fires_into_that_chat(
    instance: Instance,  # noqa: F811
) -> None:
    name = await supervised_employee(instance)
    args = {"text": "water the plants", "in_s": 2}
    reply = await chat(instance, name, f"remind me\ncall: set_alarm {json.dumps(args)}")
    assert "set_alarm returned" in reply and '"due_at"' in reply
    (row,) = await alarm_rows(instance.pool, name)
    status = await supervisor_status(instance, name)
    assert "alarms" in status.deadlines  # armed by the Signal the tool sent after commit
    assert await consumed(instance, name, "water the plants") == "water the plants"  # on time
    (row,) = await alarm_rows(instance.pool, name)
    assert row["status"] == "fired" and row["fired_at"] >= row["due_at"]
    (fired,) = await fired_inputs(instance.pool, name)
    assert fired["status"] == "routed" and fired["dedupe_key"] == f"alarm:{row['id']}"

    async def replied_to_owner() -> bool:  # the alarm's turn answered in the owner's chat
        rows = await query(instance.pool, "SELECT count(*) AS n FROM outbound_messages o "
                                          "WHERE o.employee = %s", name)  # fmt: skip
        return int(rows[0]["n"]) >= 2

    await wait_for(replied_to_owner, timeout=30, what="the alarm's turn replied to the owner")


async def add_users(api: httpx.AsyncClient, *prefixes: str) -> list[str]:
    """Users created by the admin (unique names): their tokens."""
    tokens = []
    for prefix in prefixes:
        r = await api.post("/v1/users", json={"name": f"{prefix}{uuid.uuid4().hex[:6]}"})
        assert r.status_code == 201, r.text
        tokens.append(str(r.json()["token"]))
    return tokens


async def user_says(token: str, url: str, name: str, text: str) -> str:
    """A user's chat message to `name` and the reply the user reads."""
    async with httpx.AsyncClient(base_url=url, timeout=10,
                                 headers={"Authorization": f"Bearer {token}"}) as api:  # fmt: skip
        r = await api.post(f"/v1/employees/{name}/chat",
                           json={"client_message_id": uuid.uuid4().hex, "text": text})  # fmt: skip
        assert r.status_code == 202, r.text
        mid = int(r.json()["message_id"])

        async def answered() -> str | None:
            r = await api.get(f"/v1/employees/{name}/chat/{mid}")
            return r.json()["reply"]  # type: ignore[no-any-return]

        return await wait_for(answered, timeout=30, interval=0.1, what=f"reply to {mid}")


async def test_one_users_alarm_is_not_anothers_to_list_or_cancel_and_still_fires(
    instance: Instance,  # noqa: F811
    ingress_url: str,
) -> None:
    """EG3, EG17 through whole turns: two users chat with one employee; the second user's
    conversation asks for the first's alarm by its id and is answered as for an unknown id."""
    name = await supervised_employee(instance)
    ann, ben = await add_users(instance.api, "ann", "ben")
    args = {"text": "ann's passport number is due", "in_s": 5}
    reply = await user_says(ann, ingress_url, name,
                            f"remind me\ncall: set_alarm {json.dumps(args)}")  # fmt: skip
    assert "set_alarm returned" in reply
    (row,) = await alarm_rows(instance.pool, name)
    aid, ann_thread = row["id"], row["thread"]
    listed = await user_says(ben, ingress_url, name, "call: list_alarms {}")
    assert '"alarms":[]' in listed and aid not in listed and "passport" not in listed
    cancel = {"id": aid}
    refused = await user_says(ben, ingress_url, name,
                              f"call: cancel_alarm {json.dumps(cancel)}")  # fmt: skip
    assert f"you have no alarm '{aid}'" in refused

    # The alarm is still ann's and fires into ann's conversation only.
    async def shown_to_ann() -> dict[str, list[dict[str, Any]]] | None:
        said = await transcripts(instance.pool, name)
        seen = [m for m in said.get(ann_thread, []) if m["role"] == "user"
                and m["content"] == "ann's passport number is due"]  # fmt: skip
        return said if seen else None

    said = await wait_for(shown_to_ann, timeout=30, what="the alarm shown in ann's chat")
    (row,) = await alarm_rows(instance.pool, name)
    assert row["status"] == "fired"
    (ben_thread,) = set(said) - {ann_thread}
    assert not any("passport" in str(m["content"]) for m in said[ben_thread])


async def test_late_alarms_fire_with_a_note_and_one_past_skip_after_is_missed(
    instance: Instance,  # noqa: F811
) -> None:
    name = await supervised_employee(instance)
    await armed(instance, name)  # its first read found nothing: only the Signal makes it look
    await past_alarm(instance.pool, name, "send the invoice", 3 * 3600)
    missed = await past_alarm(instance.pool, name, "join the call", 3600,
                              if_late="skip_after:PT10M", skip_after_s=600.0)  # fmt: skip
    await alarm_activity.signal_changed(instance.client, name, 1)  # as the tools do after commit
    text = await consumed(instance, name, "send the invoice")
    assert "[late: due at " in text and "fired 3 h 0 min late]" in text

    async def attention() -> list[dict[str, Any]] | None:
        return await query(instance.pool, "SELECT kind, ref FROM attention_items "
                                          "WHERE employee = %s", name) or None  # fmt: skip

    (item,) = await wait_for(attention, timeout=10, what="the missed alarm's attention item")
    assert item == {"kind": "missed_alarm", "ref": f"{name}/g1/talk/main#alarm:{missed}"}
    assert not any("join the call" in m for m in await user_messages(instance, name))


async def test_a_follow_up_is_cancelled_by_the_owners_next_message(
    instance: Instance,  # noqa: F811
) -> None:
    name = await supervised_employee(instance)
    args = {"text": "no answer yet?", "in_s": 4, "cancel_on": "inbound"}
    await chat(instance, name, f"ask them\ncall: set_alarm {json.dumps(args)}")
    await chat(instance, name, "they answered")
    (row,) = await alarm_rows(instance.pool, name)
    assert row["status"] == "cancelled"
    # Past its due time the supervisor finds nothing due: it never fires.
    await wait_for(lambda: _past(row["due_at"] + timedelta(seconds=2)), timeout=10,
                   what="past the follow-up's due time")  # fmt: skip
    status = await supervisor_status(instance, name)
    assert await fired_inputs(instance.pool, name) == []
    assert datetime.fromisoformat(status.deadlines["alarms"]) > datetime.now(UTC)


async def _past(at: datetime) -> bool:
    return datetime.now(UTC) > at


async def test_a_repeating_alarm_fires_three_times_then_is_cancelled(
    instance: Instance,  # noqa: F811
) -> None:
    name = await supervised_employee(instance)
    args = {"text": "tick", "in_s": 1, "repeat": {"every_s": 1}}
    reply = await chat(instance, name, f"tick\ncall: set_alarm {json.dumps(args)}")
    assert "set_alarm returned" in reply
    (row,) = await alarm_rows(instance.pool, name)
    aid = row["id"]

    async def three() -> list[dict[str, Any]] | None:
        rows = await fired_inputs(instance.pool, name)
        return rows if len(rows) >= 3 else None

    rows = await wait_for(three, timeout=30, what="three occurrences fired")
    assert [r["dedupe_key"] for r in rows[:3]] == [f"alarm:{aid}:{n}" for n in (1, 2, 3)]
    assert [r["envelope"]["data"]["occurrence"] for r in rows[:3]] == [1, 2, 3]
    reply = await chat(instance, name, f"stop\ncall: cancel_alarm {json.dumps({'id': aid})}")
    assert '"status":"cancelled"' in reply
    (row,) = await alarm_rows(instance.pool, name)
    assert row["status"] == "cancelled" and row["occurrence"] >= 4


async def test_after_continue_as_new_the_supervisor_reads_the_alarms_again(
    instance: Instance,  # noqa: F811
) -> None:
    name = await supervised_employee(instance)
    sid = names.supervisor_id(name, 1)
    handle = instance.client.get_workflow_handle(sid)
    await handle.terminate("test: replaced by a short roll")
    await instance.client.start_workflow(
        names.WF_SUPERVISOR,
        SupervisorInput(name, 1, Control("running", 1), continued=True, roll_after=2),
        id=sid, task_queue=instance.deliverer.workflow_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        priority=Priority(priority_key=names.SUPERVISOR_PRIORITY, fairness_key=name),
    )  # fmt: skip
    await armed(instance, name)
    first = (await handle.describe()).run_id
    # Written without a Signal: this run armed its deadline an hour ahead and does not know.
    aid = await past_alarm(instance.pool, name, "after the roll", 5)
    for revision, usd in ((2, 1), (3, 2)):  # its Update limit: it continues as new
        await handle.execute_update(
            names.UPDATE_SET_LIMITS, SetLimits({"daily_usd": usd}, revision)
        )
    assert await consumed(instance, name, "after the roll") == "after the roll"
    assert (await handle.describe()).run_id != first
    assert [r["dedupe_key"] for r in await fired_inputs(instance.pool, name)] == [f"alarm:{aid}"]
