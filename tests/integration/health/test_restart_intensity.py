"""Restart intensity and the degraded employee (SPEC §12) on the real dev server and PostgreSQL:
turns made to fail by the local provider's `fail:` script, the relay's supervision pass run by
the test (its clock too, where a window must pass)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import test_turns
from test_router import append_all, driver_event, query
from test_turns import Instance, transcript

from eventos import names
from eventos.contracts import AdmitRequest
from eventos.delivery.routing import thread_for
from eventos.health.loop import supervise_once
from eventos.runtime.service import cancel_and_wait
from eventos.scheduling import admission
from eventos.scheduling.policy import SchedConfig
from eventos.settings import SupervisionSettings
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal
instance = test_turns.instance  # the fixture: the whole path in one process

# Backoffs of a second: five failures come quickly (the retry of a failed turn waits 10 s).
QUICK = SupervisionSettings(backoff_s=(1.0, 1.0, 1.0))
# A backoff long enough to watch what it holds; no quarantine in the way.
LONG_BACKOFF = SupervisionSettings(backoff_s=(12.0, 12.0, 12.0), quarantine_after=50)
FAILS = "\nfail: 400"  # the local provider refuses the step: the turn fails


@contextlib.asynccontextmanager
async def supervising(instance: Instance, cfg: SupervisionSettings) -> AsyncIterator[None]:
    """The relay's supervision pass, every 0.2 s, for as long as the test says."""

    async def loop() -> None:
        while True:
            await supervise_once(instance.pool, instance.client, cfg)
            await asyncio.sleep(0.2)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        await cancel_and_wait([task], 10)


async def message_status(instance: Instance, message_id: int) -> str:
    rows = await query(instance.pool, "SELECT status FROM chat_messages WHERE id = %s", message_id)
    return str(rows[0]["status"])


async def dead(instance: Instance, message_id: int) -> None:
    async def is_dead() -> bool:
        return await message_status(instance, message_id) == "dead"

    await wait_for(is_dead, timeout=60, what=f"message {message_id} dead-lettered")


async def stream_row(instance: Instance, stream_key: str) -> dict[str, Any]:
    rows = await query(instance.pool, "SELECT s.hold_reason, s.hold_until, h.backoff_until, "
                       "h.backoff_step, h.quarantined_at, now() AS db_now FROM bus_streams s "
                       "LEFT JOIN thread_health h USING (stream_key) WHERE s.stream_key = %s",
                       stream_key)  # fmt: skip
    return rows[0]


async def deliveries_of(instance: Instance, ingress_ids: list[int]) -> list[dict[str, Any]]:
    q = ("SELECT d.seq, d.status FROM bus_deliveries d JOIN chat_messages m "
         "ON m.ingress_id = d.ingress_id WHERE m.id = ANY(%s) ORDER BY d.seq")  # fmt: skip
    return await query(instance.pool, q, ingress_ids)


async def items(instance: Instance, kind: str) -> list[dict[str, Any]]:
    return await query(instance.pool, "SELECT * FROM attention_items WHERE kind = %s ORDER BY id",
                       kind)  # fmt: skip


async def act(instance: Instance, item_id: int, action: str) -> tuple[int, dict[str, Any]]:
    r = await instance.api.post(f"/v1/attention/{item_id}:act", json={"action": action})
    return r.status_code, r.json()


@pytest.mark.parametrize("supervision_settings", [QUICK])
async def test_a_thread_failing_five_times_in_an_hour_is_quarantined_then_released(
    instance: Instance, supervision_settings: SupervisionSettings
) -> None:
    stream_key = names.stream_key(instance.name, 1, names.LANE_TALK, names.THREAD_MAIN)
    async with supervising(instance, supervision_settings):
        # Below the thresholds a failing input is tried twice, then dead-lettered (as before).
        for text in ("first breaks", "second breaks"):
            await dead(instance, await instance.chat(text + FAILS))
        third = await instance.chat("third breaks" + FAILS)  # the fifth failed turn

        async def quarantined() -> dict[str, Any] | None:
            row = await stream_row(instance, stream_key)
            return row if row["hold_reason"] == names.HOLD_QUARANTINED else None

        row = await wait_for(quarantined, timeout=60, what="the thread quarantined")
        assert row["quarantined_at"] is not None
        (item,) = await items(instance, names.ATTENTION_THREAD_QUARANTINED)
        assert (item["ref"], item["action"], item["state"], item["audience"]) == (
            stream_key, names.ACTION_RELEASE, "open", None)  # fmt: skip
        assert "5 turns" in item["detail"]
        # Later inputs are held in the bus; the failed one stays with its entity, not dead.
        later = [await instance.chat(f"later {n}") for n in (1, 2)]

        async def routed() -> list[dict[str, Any]] | None:
            rows = await deliveries_of(instance, later)
            return rows if len(rows) == 2 else None

        await wait_for(routed, timeout=15, what="the later inputs routed")
        for _ in range(3):
            await instance.relay.pass_once()
        assert [d["status"] for d in await deliveries_of(instance, later)] == ["pending"] * 2
        assert [d["status"] for d in await deliveries_of(instance, [third])] == ["delivered"]
        waiting = (await instance.api.get(f"/v1/employees/{instance.name}/waiting")).json()
        gates = {w["seq"]: (w["status"], w["gate"]["code"]) for w in waiting["waiting"]}
        # Why they wait: the held ones, and the one its entity holds (admission refuses it).
        assert sorted(gates.values()) == [("delivered", "quarantined")] + [
            ("pending", "quarantined")] * 2, waiting  # fmt: skip
        assert await message_status(instance, third) != "dead"
        status, body = await act(instance, item["id"], names.ACTION_CLEAR)
        assert status == 409, body  # not this item's action
        status, body = await act(instance, item["id"], names.ACTION_RELEASE)
        assert status == 202, body
        assert (body["stream"], body["held"]) == (stream_key, 3)
        # They run again, in order; the failing one gets its tries again and nothing more dies.
        for mid in later:
            assert await instance.reply(mid, timeout=60)
        assert await message_status(instance, third) == "answered"
    users = [m["content"] for m in await transcript(instance.pool) if m["role"] == "user"]
    order = [next(i for i, c in enumerate(users) if t in c)
             for t in ("third breaks", "later 1", "later 2")]  # fmt: skip
    assert order == sorted(order)
    dead_rows = await query(instance.pool, "SELECT count(*) AS n FROM bus_deliveries "
                                           "WHERE status = 'dead'")  # fmt: skip
    assert dead_rows[0]["n"] == 2  # the first two inputs, from before the quarantine
    row = await stream_row(instance, stream_key)
    assert (row["hold_reason"], row["quarantined_at"]) == (None, None)
    (item,) = await items(instance, names.ATTENTION_THREAD_QUARANTINED)
    assert item["state"] == "resolved"
    assert (await act(instance, item["id"], names.ACTION_RELEASE))[0] == 409


@pytest.mark.parametrize("supervision_settings", [LONG_BACKOFF])
async def test_three_failed_turns_in_ten_minutes_back_the_thread_off(
    instance: Instance, supervision_settings: SupervisionSettings
) -> None:
    stream_key = names.stream_key(instance.name, 1, names.LANE_TALK, names.THREAD_MAIN)
    async with supervising(instance, supervision_settings):
        await dead(instance, await instance.chat("first breaks" + FAILS))
        second = await instance.chat("second breaks" + FAILS)  # its first try: the third failure

        async def backed_off() -> dict[str, Any] | None:
            row = await stream_row(instance, stream_key)
            return row if row["hold_reason"] == names.HOLD_BACKOFF else None

        row = await wait_for(backed_off, timeout=30, what="the thread backed off")
        assert row["hold_until"] == row["backoff_until"] and row["backoff_step"] == 1
        (third,) = await query(instance.pool, "SELECT ended_at FROM turns WHERE n = 3")
        assert abs((row["hold_until"] - third["ended_at"]).total_seconds() - 12.0) < 1.0
        later = await instance.chat("later one")

        async def routed() -> list[dict[str, Any]] | None:
            return await deliveries_of(instance, [later]) or None

        await wait_for(routed, timeout=10, what="the later input routed")
        await instance.relay.pass_once()
        held = await query(instance.pool, "SELECT d.status, now() AS db_now FROM bus_deliveries "
                           "d JOIN chat_messages m ON m.ingress_id = d.ingress_id "
                           "WHERE m.id = %s", later)  # fmt: skip
        if held[0]["db_now"] < row["hold_until"] - timedelta(seconds=1):
            assert held[0]["status"] == "pending"  # waits in the database, not in the entity
        assert await instance.reply(later, timeout=90)
        # The second's retry fails too (a fourth failure: a backoff again), before or after the
        # later one's turn; once it is dead-lettered, the pass lifts the last backoff at its end.
        await dead(instance, second)

        async def lifted() -> bool:
            return (await stream_row(instance, stream_key))["hold_reason"] is None

        await wait_for(lifted, timeout=40, what="the last backoff lifted at its end")
    turns = await query(instance.pool, "SELECT n, started_at FROM turns WHERE n > 3 ORDER BY n")
    assert turns[0]["started_at"] >= row["hold_until"]  # the retry waited for the backoff too


async def fail_on_five_threads(instance: Instance) -> str:
    """Five C3 inputs on five threads, each failing twice: ten failed turns, no thread past
    its own thresholds. The gRPC source."""
    source = f"grpc:drv-{instance.name}"
    await append_all(instance.pool, [driver_event(f"s{n}", n, source, text="breaks" + FAILS)
                                     for n in range(5)])  # fmt: skip

    async def all_failed() -> bool:
        rows = await query(instance.pool, "SELECT count(*) AS n FROM bus_deliveries "
                                          "WHERE status = 'dead'")  # fmt: skip
        return rows[0]["n"] == 5

    await wait_for(all_failed, timeout=90, what="five inputs dead after two tries each")
    return source


async def test_a_degraded_employee_holds_background_work_and_recovers_with_its_window(
    instance: Instance,
) -> None:
    cfg = SupervisionSettings()
    source = await fail_on_five_threads(instance)
    done = await supervise_once(instance.pool, instance.client, cfg)
    assert done.judged.degraded == [instance.name]
    shown = (await instance.api.get(f"/v1/employees/{instance.name}")).json()
    assert shown["degraded"]["reason"] == "10 of 10 turns failed within 15 minutes"
    (item,) = await items(instance, names.ATTENTION_EMPLOYEE_DEGRADED)
    assert (item["ref"], item["action"], item["state"], item["audience"]) == (
        instance.name, names.ACTION_CLEAR, "open", None)  # fmt: skip
    notices = await query(instance.pool, "SELECT text FROM chat_events WHERE kind = 'notice'")
    assert [n["text"].startswith(f"{instance.name} is degraded") for n in notices] == [True]
    # Background work waits (held by the relay, refused by admission); the owner's chat goes on.
    await append_all(instance.pool, [driver_event("fresh", 99, source, text="background work")])
    thread = thread_for("subject", {"subject": "fresh"}, 0)
    fresh = names.stream_key(instance.name, 1, names.LANE_WORKER, thread)

    async def held() -> bool:
        rows = await query(instance.pool, "SELECT hold_reason FROM bus_streams "
                                          "WHERE stream_key = %s", fresh)  # fmt: skip
        return bool(rows) and rows[0]["hold_reason"] == names.HOLD_DEGRADED

    await wait_for(held, timeout=20, what="the background stream held `degraded`")
    assert "still answered" in await instance.reply(await instance.chat("still answered"))
    async with instance.pool.connection() as conn:
        for klass, granted in ((names.C3_INTERNAL, False), (names.C2_CUSTOMER, True)):
            req = AdmitRequest(instance.name, 1, "front", thread, fresh, klass)
            answer = (await admission.acquire(conn, req, SchedConfig())).admission
            assert answer.granted is granted, answer
            if not granted:
                assert answer.gate == names.GATE_DEGRADED
            else:
                await admission.release(conn, SchedConfig(), answer.turn_id, names.TURN_CANCELLED)
    (delivery,) = await query(instance.pool, "SELECT status FROM bus_deliveries "
                                             "WHERE stream_key = %s", fresh)  # fmt: skip
    assert delivery["status"] == "pending"
    # 16 minutes on, the failures are out of the window: it recovers by itself.
    later = datetime.now(UTC) + timedelta(minutes=16)
    done = await supervise_once(instance.pool, instance.client, cfg, now=later)
    assert done.judged.recovered == [instance.name]
    shown = (await instance.api.get(f"/v1/employees/{instance.name}")).json()
    assert shown["degraded"] is None
    assert (await items(instance, names.ATTENTION_EMPLOYEE_DEGRADED))[0]["state"] == "resolved"

    async def consumed() -> bool:
        rows = await query(instance.pool, "SELECT status FROM bus_deliveries "
                                          "WHERE stream_key = %s", fresh)  # fmt: skip
        return rows[0]["status"] == "done"

    await wait_for(consumed, timeout=30, what="the held background input run")


async def test_the_owner_clears_a_degraded_employee_and_its_window_starts_anew(
    instance: Instance,
) -> None:
    cfg = SupervisionSettings(degraded_min_failed=2)  # one input failing twice is enough
    await append_all(instance.pool, [driver_event("s1", 1, f"grpc:drv-{instance.name}",
                                                  text="breaks" + FAILS)])  # fmt: skip

    async def degraded() -> list[str]:
        return (await supervise_once(instance.pool, None, cfg)).judged.degraded

    await wait_for(degraded, timeout=60, what="the employee degraded")
    (item,) = await items(instance, names.ATTENTION_EMPLOYEE_DEGRADED)
    user = (await instance.api.post("/v1/users", json={"name": f"u{uuid.uuid4().hex[:6]}"})).json()
    r = await instance.api.post(f"/v1/attention/{item['id']}:act", json={"action": "clear"},
                                headers={"Authorization": f"Bearer {user['token']}"})  # fmt: skip
    assert r.status_code == 404  # a user neither sees nor acts on the admin's items
    status, body = await act(instance, item["id"], names.ACTION_CLEAR)
    assert (status, body) == (202, {"item": item["id"], "action": "clear",
                                    "employee": instance.name})  # fmt: skip
    assert (await instance.api.get(f"/v1/employees/{instance.name}")).json()["degraded"] is None
    assert (await items(instance, names.ATTENTION_EMPLOYEE_DEGRADED))[0]["state"] == "resolved"
    # The failures before the clear no longer count: the next pass leaves it be.
    assert (await supervise_once(instance.pool, None, cfg)).judged.degraded == []
    assert (await act(instance, item["id"], names.ACTION_CLEAR))[0] == 409
    status, body = await act(instance, item["id"], "bogus")
    assert status == 400 and "release" in body["errors"][0]["message"], body
