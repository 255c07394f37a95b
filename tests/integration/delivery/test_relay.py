"""The relay on the real dev server and real PostgreSQL (SPEC §8 step 3)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import SPEC, apply_and_start
from metrics_table import sample
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.service import RPCError
from test_router import append_all, driver_event, query, route_until_done

from eventos import names
from eventos.contracts import EntityStatus
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.delivery.relay import Breaker, Relay, StaleLease, lanes_loop
from eventos.employees import lifecycle
from eventos.local.ports import free_port
from eventos.outbox.keys import OutboxKeys
from eventos.owner import chat
from eventos.runtime.metrics import BREAKERS_OPEN, DEAD_LETTERS, RELAY_LAG
from eventos.runtime.payload_guard import connect
from eventos.runtime.temporal import TemporalConnection
from eventos.runtime.wake import WakeSignal
from eventos.settings import TemporalSettings
from eventos.testing import wait_for
from eventos.workers.activities import DbActivities
from eventos.workers.roles import workflow_worker

pytestmark = pytest.mark.temporal


@pytest.fixture
async def client(temporal_settings: TemporalSettings) -> Client:
    return await connect(temporal_settings.address, temporal_settings.namespace)


@pytest.fixture
async def task_queue(
    client: Client, pool: AsyncConnectionPool[Conn], outbox_keys: OutboxKeys
) -> AsyncIterator[str]:
    """A workflow worker (with its local database activities) on a queue of this test's own."""
    queue = f"wf-{uuid.uuid4().hex[:8]}"
    async with workflow_worker(client, queue, DbActivities(pool, outbox=outbox_keys)):
        yield queue


@pytest.fixture
async def employee(pool: AsyncConnectionPool[Conn]) -> str:
    """A running employee whose name (and so entity ids) no other test shares."""
    name = f"sup-{uuid.uuid4().hex[:8]}"
    await apply_and_start(pool, SPEC.replace("name: support", f"name: {name}"))
    return name


def relay_for(
    pool: AsyncConnectionPool[Conn],
    settings: TemporalSettings,
    queue: str,
    rid: str = "relay-a",
    **kw: Any,
) -> Relay:
    return Relay(pool, TemporalConnection(settings), rid, task_queue=queue, **kw)


async def next_served(relay: Relay) -> int:
    """The calls of the next pass that serves anything: a stream the entity's own work has
    locked at that moment is skipped (SKIP LOCKED) and served by a later pass."""
    return await wait_for(relay.pass_once, timeout=10, what="a pass that serves")


async def drain(relay: Relay) -> int:
    total = 0
    while sent := await relay.pass_once():
        total += sent
    return total


async def entity(
    client: Client, pool: AsyncConnectionPool[Conn], subject: str | None = None
) -> EntityStatus:
    rows = await query(pool, "SELECT entity_id FROM bus_streams ORDER BY stream_key")
    entity_id = rows[0]["entity_id"]
    return await client.get_workflow_handle(entity_id).query(
        names.QUERY_STATUS, result_type=EntityStatus
    )


async def stream(pool: AsyncConnectionPool[Conn]) -> dict[str, Any]:
    (row,) = await query(pool, "SELECT * FROM bus_streams")
    return row


async def test_batches_of_16_up_to_the_window_then_hold(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("alice", n) for n in range(40)])
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue)
    assert await drain(relay) == 2  # 16 + 16: the window (32 inputs) is full
    status = await entity(client, pool)
    assert (status.received, status.applied_seq, status.signals, status.dropped) == (32, 32, 2, 0)
    s = await stream(pool)
    assert (s["delivered_seq"], s["hold_reason"]) == (32, names.HOLD_WINDOW)
    counts = await query(
        pool, "SELECT status, count(*) AS n FROM bus_deliveries GROUP BY 1 ORDER BY 1"
    )
    assert [(c["status"], c["n"]) for c in counts] == [("delivered", 32), ("pending", 8)]
    assert s["top_pending_class"] == names.C3_INTERNAL


async def test_a_streams_batches_go_from_one_read_and_its_last_commit_gives_the_lease_back(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("carol", n) for n in range(32)])
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue)
    reads: list[list[str]] = []
    releases: list[object] = []
    read, release = relay._read_statement, relay._release_leases

    async def counted_read(conn: Conn, keys: list[str]) -> dict[str, list[dict[str, Any]]]:
        reads.append(keys)
        return await read(conn, keys)

    async def counted_release(leases: list[tuple[str, int]]) -> dict[tuple[str, int], None]:
        releases.append(leases)
        return await release(leases)

    relay._read_statement = counted_read  # type: ignore[method-assign]
    relay._release_leases = counted_release  # type: ignore[method-assign]
    assert await relay.pass_once() == 2
    assert len(reads) == 1 and releases == []  # the read was short of the window: no re-read
    s = await stream(pool)
    assert (s["delivered_seq"], s["hold_reason"], s["top_pending_class"]) == (32, None, None)
    (lease,) = await query(pool, "SELECT until <= now() AS free FROM bus_leases")
    assert lease["free"]  # given back with the last commit
    status = await entity(client, pool)
    assert (status.received, status.applied_seq, status.signals) == (32, 32, 2)


async def test_a_read_cut_by_bytes_delivers_in_order_until_the_window_holds(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    """Inputs of ~40 KB: a read stops at the window's 512 KB, batches stop at 256 KB, and the
    window holds once full, every input delivered once and in order."""
    pad = "x" * 40_000
    await append_all(pool, [driver_event("dave", n, pad=pad) for n in range(20)])
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue)
    now = [1000.0]  # the rate's clock: a second passes between passes (4 calls per second)
    relay.clock = lambda: now[0]
    while await relay.pass_once():
        now[0] += 1.0
    s = await stream(pool)
    rows = await query(pool, "SELECT seq, status, size FROM bus_deliveries ORDER BY seq")
    delivered = [r for r in rows if r["status"] == "delivered"]
    assert [r["seq"] for r in delivered] == list(range(1, len(delivered) + 1))
    # The last batch went while the window had room (a batch holds at least one input).
    sizes = [r["size"] for r in delivered]
    assert sum(sizes[:-1]) < names.WINDOW_MAX_BYTES <= sum(sizes) < len(rows) * sizes[0]
    assert (s["delivered_seq"], s["hold_reason"]) == (len(delivered), names.HOLD_WINDOW)
    status = await entity(client, pool)
    assert (status.received, status.applied_seq, status.dropped) == (len(delivered),) * 2 + (0,)


async def test_a_crash_between_accept_and_commit_repeats_a_batch_the_entity_drops(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("bob", n) for n in range(10)])
    await route_until_done(pool)
    dying = relay_for(pool, temporal_settings, task_queue, "relay-dying", lease_ttl_s=1.0)

    async def crash(*args: object, **kwargs: object) -> None:
        raise asyncio.CancelledError  # the process dies: no commit, no lease release

    dying._commit = crash  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await dying.pass_once()
    assert (await stream(pool))["delivered_seq"] == 0
    survivor = relay_for(pool, temporal_settings, task_queue, "relay-b")
    assert await survivor.pass_once() == 0  # the dead relay's lease still holds

    async def delivered() -> int:
        await survivor.pass_once()
        return int((await stream(pool))["delivered_seq"]) == 10

    await wait_for(delivered, timeout=10, interval=0.2, what="the survivor delivers after expiry")
    status = await entity(client, pool)
    assert (status.received, status.dropped, status.applied_seq) == (10, 10, 10)


async def test_the_fencing_token_stops_a_stale_relays_commit(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("carol", n) for n in range(5)])
    await route_until_done(pool)
    key = (await stream(pool))["stream_key"]
    async with pool.connection() as conn:
        params = {"owner": "stale", "classes": list(names.CLASSES), "limit": 1, "ttl_s": 0.5}
        cur = await conn.execute(Q["stream_claim"], params)
        (lease,) = await cur.fetchall()
    fresh = relay_for(pool, temporal_settings, task_queue, "fresh")
    await wait_for(
        lambda: fresh.pass_once(), timeout=10, interval=0.2, what="fresh relay takes over"
    )
    stale = relay_for(pool, temporal_settings, task_queue, "stale")
    with pytest.raises(StaleLease):
        await stale._commit(key, int(lease["fencing_token"]), 5)
    assert (await stream(pool))["delivered_seq"] == 5
    assert (await entity(client, pool)).received == 5


async def test_two_relays_never_deliver_a_batch_twice_as_new_work(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    subjects = ["a", "b", "c", "d"]
    await append_all(pool, [driver_event(subjects[n % 4], n) for n in range(80)])
    await route_until_done(pool)
    relays = [relay_for(pool, temporal_settings, task_queue, f"r{i}") for i in range(2)]
    await asyncio.gather(*(drain(r) for r in relays), *(drain(r) for r in relays))
    await asyncio.gather(*(drain(r) for r in relays))
    rows = await query(pool, "SELECT entity_id, delivered_seq, next_seq FROM bus_streams")
    assert len(rows) == 4
    for row in rows:
        assert row["delivered_seq"] == row["next_seq"] - 1 == 20
        handle = client.get_workflow_handle(row["entity_id"])
        status = await handle.query(names.QUERY_STATUS, result_type=EntityStatus)
        assert (status.received, status.applied_seq) == (20, 20)
        assert status.dropped == 0


async def test_a_retired_generation_turns_pending_inputs_dead(
    employee: str,
    pool: AsyncConnectionPool[Conn],
    task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:
    await append_all(pool, [driver_event("dan", n) for n in range(3)])
    await route_until_done(pool)
    async with pool.connection() as conn:  # retired by a path that left its inputs pending
        await conn.execute("UPDATE generations SET state = 'retired'")
    relay = relay_for(pool, temporal_settings, task_queue)
    before = sample(DEAD_LETTERS, reason="reset")
    assert await relay.pass_once() == 0
    rows = await query(pool, "SELECT status, reason FROM bus_deliveries")
    assert {(r["status"], r["reason"]) for r in rows} == {("dead", "reset")}
    assert sample(DEAD_LETTERS, reason="reset") == before + 3
    assert (await stream(pool))["top_pending_class"] is None


async def test_breaker_while_temporal_is_down_then_delivery(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("eve", n) for n in range(3)])
    await route_until_done(pool)
    nowhere = TemporalSettings(address=f"127.0.0.1:{free_port()}")
    relay = relay_for(pool, nowhere, task_queue, breaker=Breaker(probe_interval_s=0.2))
    assert await relay.pass_once() == 0
    assert relay.breaker.opened
    assert sample(BREAKERS_OPEN, "", breaker="temporal") == 1
    assert (await stream(pool))["delivered_seq"] == 0
    assert await relay.pass_once() == 0  # open: nothing is claimed until the probe
    relay.temporal = TemporalConnection(temporal_settings)  # Temporal is back
    await wait_for(
        lambda: relay.pass_once(), timeout=10, interval=0.1, what="delivery after the probe"
    )
    assert not relay.breaker.opened
    assert sample(BREAKERS_OPEN, "", breaker="temporal") == 0
    assert (await entity(client, pool)).received == 3


async def test_paused_employees_streams_are_not_served(
    employee: str,
    pool: AsyncConnectionPool[Conn],
    task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:
    await append_all(pool, [driver_event("fay", 1)])
    await route_until_done(pool)
    async with pool.connection() as conn:
        await lifecycle.stop(conn, employee)
    relay = relay_for(pool, temporal_settings, task_queue)
    assert await relay.pass_once() == 0
    async with pool.connection() as conn:
        await lifecycle.resume(conn, employee)
    assert await relay.pass_once() == 1


async def test_an_input_temporal_keeps_refusing_is_dead_lettered_without_blocking(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("gus", n) for n in range(3)])
    await route_until_done(pool)
    async with pool.connection() as conn:  # an input no batch can carry (I7)
        await conn.execute(
            "UPDATE bus_deliveries SET payload = jsonb_build_object('blob', repeat('x', 400000)) WHERE seq = 1"
        )
    relay = relay_for(pool, temporal_settings, task_queue)
    before = sample(DEAD_LETTERS, reason="rejected")
    for attempt in range(1, names.DEAD_AFTER_ATTEMPTS):
        assert await relay.pass_once() == 0
        (row,) = await query(
            pool, "SELECT status, attempts, reason FROM bus_deliveries WHERE seq = 1"
        )
        assert (row["status"], row["attempts"]) == ("pending", attempt)
    await relay.pass_once()
    rows = await query(pool, "SELECT seq, status, reason FROM bus_deliveries ORDER BY seq")
    assert rows[0]["status"] == "dead"
    assert "PayloadTooLarge" in rows[0]["reason"] and "bound (SPEC I7)" in rows[0]["reason"]
    assert sample(DEAD_LETTERS, reason="rejected") == before + 1
    assert [r["status"] for r in rows[1:]] == ["delivered", "delivered"]
    status = await entity(client, pool)
    assert (status.received, status.applied_seq) == (2, 3)


async def test_claimed_streams_are_served_owner_class_first(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    """Older C3 backlog, a newer owner message: the owner's entity is started first."""
    await append_all(pool, [driver_event(f"cust-{n}", n) for n in range(6)])
    async with pool.connection() as conn:
        await chat.send(conn, employee, uuid.uuid4().hex, "me first")
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue)
    classes = [f"c{c}" for c in names.CLASSES]
    lagged = {c: sample(RELAY_LAG, "_count", llm_class=c) for c in classes}
    assert await relay.pass_once() == 7
    # One lag per input delivered, by its class: the owner's message is C1.
    after = {c: sample(RELAY_LAG, "_count", llm_class=c) for c in classes}
    assert after["c1"] == lagged["c1"] + 1
    assert sum(after.values()) == sum(lagged.values()) + 7
    rows = await query(pool, "SELECT lane, entity_id FROM bus_streams")
    started = {}
    for row in rows:
        described = await client.get_workflow_handle(row["entity_id"]).describe()
        started[row["entity_id"]] = (described.start_time, row["lane"])
    first = min(started.values())
    assert first[1] == names.LANE_TALK
    owner_start = first[0]
    assert all(t > owner_start for t, lane in started.values() if lane != names.LANE_TALK)


async def test_at_most_four_calls_per_entity_per_second_and_the_loop_wakes_when_allowed(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    relay = relay_for(pool, temporal_settings, task_queue)
    now = [1000.0]  # the rate's clock, moved by hand: the calls take what the machine takes
    relay.clock = lambda: now[0]
    for n in range(4):
        await append_all(pool, [driver_event("hal", n)])
        await route_until_done(pool)
        assert await next_served(relay) == 1
        now[0] += 0.1
    await append_all(pool, [driver_event("hal", 4)])
    await route_until_done(pool)

    async def held_back() -> float | None:
        assert await relay.pass_once() == 0  # a fifth call within the second waits
        wait = relay.idle_wait(poll_s=1.0)
        return wait if wait < 1.0 else None  # 1.0: skipped while its entity's work locked it

    # … until the oldest call is a second old; once: then the plain poll interval again.
    waits = await wait_for(held_back, timeout=10, what="the fifth call held by the rate")
    assert waits == pytest.approx(0.6)
    assert relay.idle_wait(poll_s=1.0) == 1.0
    now[0] += 0.6
    assert await next_served(relay) == 1  # the fifth call, once allowed
    assert (await entity(client, pool)).received == 5


async def test_a_window_consumed_meanwhile_is_not_held(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    """The hold is decided under the stream's lock on the window as it is then: a consuming
    save that ran after the relay read a full window must not leave a hold nobody lifts."""
    await append_all(pool, [driver_event("ivy", n) for n in range(40)])
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue)
    assert await drain(relay) == 2
    async with pool.connection() as conn:  # the entity consumed the window meanwhile
        await conn.execute("UPDATE bus_streams SET hold_reason = NULL")
        await conn.execute("UPDATE bus_deliveries SET status = 'done' WHERE seq <= 20")
    async with pool.connection() as conn:
        await relay._hold_window(conn, (await stream(pool))["stream_key"])
    assert (await stream(pool))["hold_reason"] is None
    assert await next_served(relay) == 1  # room for 20 more: 8 pending go out


async def test_while_temporal_pushes_back_each_pass_shares_its_calls_by_class(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event(f"cust-{n}", n) for n in range(6)])  # six C3 streams
    async with pool.connection() as conn:
        await chat.send(conn, employee, uuid.uuid4().hex, "owner here")  # one C1 stream
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue)
    relay.pauses.last_at = time.monotonic()  # as if RESOURCE_EXHAUSTED had just come back
    relay.pauses.budget = 2
    assert await relay.pass_once() == 2  # two calls: the owner's stream and one C3 stream
    rows = await query(pool, "SELECT lane, delivered_seq FROM bus_streams ORDER BY lane")
    served = [(r["lane"], r["delivered_seq"]) for r in rows if r["delivered_seq"]]
    assert sorted(served) == [(names.LANE_TALK, 1), (names.LANE_WORKER, 1)]
    leases = await query(pool, "SELECT count(*) AS n FROM bus_leases WHERE until > now()")
    assert leases[0]["n"] == 0  # the leases not granted were given back at once
    assert relay.pauses.budget == 4  # one more call per accepted call
    while await relay.pass_once():  # the shares go round: everyone is served in the end
        pass
    rows = await query(pool, "SELECT delivered_seq FROM bus_streams")
    assert [r["delivered_seq"] for r in rows] == [1] * 7


async def statuses(client: Client, pool: AsyncConnectionPool[Conn]) -> list[EntityStatus]:
    rows = await query(pool, "SELECT entity_id FROM bus_streams ORDER BY stream_key")
    return [
        await client.get_workflow_handle(r["entity_id"]).query(
            names.QUERY_STATUS, result_type=EntityStatus
        )
        for r in rows
    ]


async def test_streams_served_together_keep_each_streams_order_and_window(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    subjects = [f"t{n}" for n in range(12)]
    for n in range(32):  # interleaved: each stream's seq order is not the append order
        await append_all(pool, [driver_event(s, n) for s in subjects])
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue)
    assert await relay.pass_once() == 24  # 16 + 16 per stream, their statements grouped
    for status in await statuses(client, pool):  # a batch out of order would be dropped
        assert (status.received, status.applied_seq, status.signals, status.dropped) == (
            32, 32, 2, 0,
        )  # fmt: skip
    rows = await query(
        pool, "SELECT delivered_seq, hold_reason, top_pending_class FROM bus_streams"
    )
    assert [tuple(r.values()) for r in rows] == [(32, None, None)] * 12  # nothing left to hold
    assert await relay.pass_once() == 0


async def test_a_grouped_commit_fenced_off_for_one_stream_commits_the_others(
    employee: str, pool: AsyncConnectionPool[Conn], temporal_settings: TemporalSettings,
    task_queue: str,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("first", n) for n in range(3)])
    await append_all(pool, [driver_event("second", n) for n in range(3)])
    await route_until_done(pool)
    async with pool.connection() as conn:
        params = {"owner": "stale", "classes": list(names.CLASSES), "limit": 2, "ttl_s": 0.3}
        cur = await conn.execute(Q["stream_claim"], params)
        old = {r["stream_key"]: int(r["fencing_token"]) for r in await cur.fetchall()}
    first, second = sorted(old, key=lambda k: "first" not in k)

    async def taken_over() -> bool:  # the first stream (oldest pending) passes to another relay
        async with pool.connection() as conn:
            params = {"owner": "fresh", "classes": list(names.CLASSES), "limit": 1, "ttl_s": 30}
            cur = await conn.execute(Q["stream_claim"], params)
            return [r["stream_key"] for r in await cur.fetchall()] == [first]

    await wait_for(taken_over, timeout=10, interval=0.1, what="the first stream's lease expires")
    stale = relay_for(pool, temporal_settings, task_queue, "stale")
    results = await asyncio.gather(
        stale._commit(first, old[first], 3), stale._commit(second, old[second], 3, True),
        return_exceptions=True,
    )  # fmt: skip
    assert isinstance(results[0], StaleLease)
    assert results[1] and all(r["seq"] is None for r in results[1])  # read again: none pending
    rows = await query(pool, "SELECT stream_key, delivered_seq FROM bus_streams")
    assert {r["stream_key"]: r["delivered_seq"] for r in rows} == {first: 0, second: 3}


async def test_one_call_in_flight_per_stream(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("ivy", n) for n in range(32)])
    await route_until_done(pool)
    async with pool.connection() as conn:
        params = {"owner": "relay-a", "classes": list(names.CLASSES), "limit": 1, "ttl_s": 30}
        cur = await conn.execute(Q["stream_claim"], params)
        (lease,) = await cur.fetchall()
    relay = relay_for(pool, temporal_settings, task_queue)
    key, token = str(lease["stream_key"]), int(lease["fencing_token"])
    sent = await asyncio.gather(relay._serve(key, token), relay._serve(key, token))
    assert sorted(sent) == [0, 2]  # the second serving of the stream found it being served
    status = await entity(client, pool)
    assert (status.received, status.signals, status.dropped) == (32, 2, 0)


async def test_the_owners_lane_delivers_while_a_pass_over_background_streams_is_busy(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings,
) -> None:  # fmt: skip
    """The relay service's loop (`lanes_loop`): a background stream's call hangs mid-pass, and
    an owner message routed meanwhile is still delivered (issue 27: one loop made it wait for
    the whole pass)."""
    release, held = asyncio.Event(), []

    class HangingBackground(Relay):
        async def _send(self, stream: dict[str, Any], batch: list[Any]) -> bool:
            if min(item.klass for item in batch) != names.C1_OWNER:
                held.append(stream["stream_key"])
                await release.wait()
            return await super()._send(stream, batch)

    await append_all(pool, [driver_event("bg", 0)])
    await route_until_done(pool)
    relay = HangingBackground(pool, TemporalConnection(temporal_settings), "relay-a",
                              task_queue=task_queue)  # fmt: skip
    wake = WakeSignal()
    loop = asyncio.create_task(lanes_loop(relay, wake, 0.2))

    async def hanging() -> bool:
        return bool(held)

    try:
        await wait_for(hanging, timeout=10, what="a background call in flight")
        async with pool.connection() as conn:
            await chat.send(conn, employee, uuid.uuid4().hex, "me, now")
        await route_until_done(pool)
        wake.set()
        talk = "SELECT delivered_seq FROM bus_streams WHERE lane = %s AND delivered_seq > 0"

        async def owner_delivered() -> bool:
            return bool(await query(pool, talk, names.LANE_TALK))

        await wait_for(owner_delivered, timeout=10, what="the owner's message delivered")
        assert not release.is_set() and held == [held[0]]  # the background call still hangs
    finally:
        release.set()
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


async def test_the_owners_conversation_and_its_turn_run_on_the_owners_queue(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys,
) -> None:  # fmt: skip
    """With `owner_task_queue`, the owner chat's entity and its turn start on the owner's
    workflow queue, served by a worker of that queue; other conversations stay on theirs."""
    owner_queue = names.owner_queue(task_queue)
    await append_all(pool, [driver_event("bg", 0)])
    async with pool.connection() as conn:
        await chat.send(conn, employee, uuid.uuid4().hex, "hello")
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue, owner_task_queue=owner_queue)
    db = DbActivities(pool, outbox=outbox_keys)
    async with workflow_worker(client, task_queue, db, owner=True):
        assert await drain(relay) == 2
        rows = await query(pool, "SELECT lane, entity_id FROM bus_streams")
        queues = {}
        for row in rows:
            described = await client.get_workflow_handle(row["entity_id"]).describe()
            queues[row["lane"]] = described.task_queue
        assert queues == {names.LANE_TALK: owner_queue, names.LANE_WORKER: task_queue}
        turns = "SELECT id FROM turns WHERE thread = 'main' AND class = 1"
        (turn,) = await wait_for(lambda: query(pool, turns), timeout=20, what="the owner's turn")

        async def turn_started() -> WorkflowExecutionDescription | None:
            # Admission writes the turn's row before the entity starts its child workflow.
            with contextlib.suppress(RPCError):
                return await client.get_workflow_handle(turn["id"]).describe()
            return None

        described = await wait_for(turn_started, timeout=20, what="the owner's turn workflow")
        assert described.task_queue == owner_queue


async def test_the_other_conversations_turns_run_on_the_turns_queue(
    employee: str, pool: AsyncConnectionPool[Conn], client: Client, task_queue: str,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys,
) -> None:  # fmt: skip
    """With `turn_task_queue`, a background conversation's entity starts on the instance's
    queue and its turn on the turns' queue (served by a worker of its own), whose LLM step
    goes to the home queue's class queue; the entity's cursor names the turns' queue."""
    turns_queue = names.turn_queue(task_queue)
    await append_all(pool, [driver_event("bg", 0)])
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue, turn_task_queue=turns_queue)
    db = DbActivities(pool, outbox=outbox_keys)
    async with workflow_worker(client, task_queue, db, turns=True):  # the fixture's runs too
        assert await drain(relay) == 1
        (row,) = await query(pool, "SELECT entity_id FROM bus_streams")
        entity = client.get_workflow_handle(row["entity_id"])
        assert (await entity.describe()).task_queue == task_queue
        (turn,) = await wait_for(lambda: query(pool, "SELECT id, class FROM turns"), timeout=20,
                                 what="the turn admitted")  # fmt: skip
        llm = names.queue_for(names.LLM_QUEUES[turn["class"]], task_queue)

        async def step_scheduled() -> str | None:
            with contextlib.suppress(RPCError):
                async for e in client.get_workflow_handle(turn["id"]).fetch_history_events():
                    if e.HasField("activity_task_scheduled_event_attributes"):
                        return e.activity_task_scheduled_event_attributes.task_queue.name
            return None

        assert await wait_for(step_scheduled, timeout=20, what="the turn's LLM step") == llm
        described = await client.get_workflow_handle(turn["id"]).describe()
        assert described.task_queue == turns_queue
        first = (await entity.fetch_history()).events[0]
        cursor = first.workflow_execution_started_event_attributes.input.payloads[0].data
        assert json.loads(cursor)["turn_queue"] == turns_queue


async def test_a_grouped_commit_takes_stream_rows_in_key_order_and_never_deadlocks_the_router(
    employee: str, pool: AsyncConnectionPool[Conn], temporal_settings: TemporalSettings,
    task_queue: str,
) -> None:  # fmt: skip
    """The router locks the stream rows it writes in key order; a grouped commit asked for the
    streams in another order waits on the first key and holds none of the others meanwhile
    (it took the last key first before, and the two deadlocked: one failed after a second)."""
    await append_all(pool, [driver_event("first", n) for n in range(3)])
    await append_all(pool, [driver_event("second", n) for n in range(3)])
    await route_until_done(pool)
    relay = relay_for(pool, temporal_settings, task_queue, "relay-a")
    async with pool.connection() as conn:
        params = {"owner": "relay-a", "classes": list(names.CLASSES), "limit": 2, "ttl_s": 60}
        cur = await conn.execute(Q["stream_claim"], params)
        tokens = {r["stream_key"]: int(r["fencing_token"]) for r in await cur.fetchall()}
    low, high = sorted(tokens)
    lock = "SELECT 1 FROM bus_streams WHERE stream_key = %s FOR UPDATE"
    async with pool.connection() as router, router.transaction():
        await router.execute(lock, (low,))
        batches = [(key, tokens[key], 3, False, True) for key in (high, low)]
        commit = asyncio.create_task(relay._commit_batches(batches))

        async def commit_waits() -> bool:  # on the row the router holds
            rows = await query(pool, """SELECT 1 FROM pg_stat_activity WHERE wait_event_type =
                                        'Lock' AND query LIKE '%%bus_deliveries%%'""")  # fmt: skip
            return bool(rows)

        await wait_for(commit_waits, timeout=10, what="the grouped commit waiting on a lock")
        await router.execute(lock, (high,))  # the router's next row, in key order
    result = await asyncio.wait_for(commit, timeout=10)
    assert {b[0]: r[0] for b, r in result.items()} == {high: True, low: True}
    rows = await query(pool, "SELECT stream_key, delivered_seq FROM bus_streams")
    assert {r["stream_key"]: r["delivered_seq"] for r in rows} == {low: 3, high: 3}
