"""The router (SPEC §8 step 2): contiguous seq per stream, per-source order, exactly once."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from conftest import apply_and_start
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.bus.inbox import Accepted, IngressRecord, append
from eventos.db import Conn
from eventos.delivery.routing import RouteStats, route_pass, route_sources
from eventos.employees import lifecycle

DRIVER_SOURCE = "grpc:drv-1"


def driver_event(subject: str, n: int, source: str = DRIVER_SOURCE, **data: Any) -> IngressRecord:
    envelope = {"specversion": "1.0", "id": uuid.uuid4().hex, "source": "/drv", "type": "msg",
                "subject": subject, "data": {"n": n, **data}}  # fmt: skip
    return IngressRecord(
        source_key=source, dedupe_key=f"{subject}:{n}:{uuid.uuid4().hex[:6]}", type="msg",
        chain_id=envelope["id"], envelope=envelope, size=len(json.dumps(envelope)),
    )  # fmt: skip


async def append_all(pool: AsyncConnectionPool[Conn], records: list[IngressRecord]) -> list[int]:
    async with pool.connection() as conn:
        outcomes = await append(conn, records)
    assert all(isinstance(o, Accepted) for o in outcomes)
    return [o.id for o in outcomes if isinstance(o, Accepted)]


async def route_until_done(pool: AsyncConnectionPool[Conn]) -> RouteStats:
    total = RouteStats()
    async with pool.connection() as conn:
        while True:
            stats = await route_pass(conn)
            if not stats.rows and not stats.busy_sources:
                return total
            total.routed += stats.routed
            total.no_consumer += stats.no_consumer
            total.dead += stats.dead
            total.deliveries += stats.deliveries
            total.streams |= stats.streams


async def query(pool: AsyncConnectionPool[Conn], q: str, *args: object) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(q, args or None)  # type: ignore[arg-type]
        return await cur.fetchall()


async def test_two_routers_give_contiguous_seq_and_keep_per_source_order(
    started: str, pool: AsyncConnectionPool[Conn]
) -> None:
    subjects = ["alice", "bob", "carol"]
    ids: list[int] = []

    async def producer() -> None:
        for batch in range(20):
            recs = [driver_event(subjects[i % 3], batch * 30 + i) for i in range(30)]
            ids.extend(await append_all(pool, recs))
            await asyncio.sleep(0)

    async def router(stop: asyncio.Event) -> int:
        routed = 0
        async with pool.connection() as conn:
            while not stop.is_set():
                stats = await route_pass(conn)
                routed += stats.routed
                if not stats.rows:
                    await asyncio.sleep(0.01)
        return routed

    stop = asyncio.Event()
    routers = [asyncio.create_task(router(stop)) for _ in range(2)]
    await producer()
    await route_until_done(pool)
    stop.set()
    counts = await asyncio.gather(*routers)
    assert len(ids) == 600
    assert sum(counts) <= 600
    rows = await query(
        pool, "SELECT stream_key, seq, ingress_id FROM bus_deliveries ORDER BY stream_key, seq"
    )
    assert len(rows) == 600
    assert sorted(r["ingress_id"] for r in rows) == sorted(ids)  # each row routed exactly once
    by_stream: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_stream.setdefault(r["stream_key"], []).append(r)
    assert len(by_stream) == 3
    for stream, items in by_stream.items():
        assert [r["seq"] for r in items] == list(range(1, len(items) + 1)), stream
        assert [r["ingress_id"] for r in items] == sorted(r["ingress_id"] for r in items), stream
    streams = await query(pool, "SELECT stream_key, next_seq, top_pending_class FROM bus_streams")
    for s in streams:
        assert s["next_seq"] == len(by_stream[s["stream_key"]]) + 1
        assert s["top_pending_class"] == names.C3_INTERNAL


async def test_thread_per_counterpart_carries_no_personal_data(
    started: str, pool: AsyncConnectionPool[Conn]
) -> None:
    await append_all(pool, [driver_event("+49 151 0000", 1), driver_event("+49 151 0000", 2),
                            driver_event("someone@example.com", 3)])  # fmt: skip
    await route_until_done(pool)
    rows = await query(pool, "SELECT DISTINCT thread, stream_key FROM bus_deliveries")
    assert len(rows) == 2
    for r in rows:
        assert r["thread"].startswith("t_")
        assert "0000" not in r["stream_key"] and "example" not in r["stream_key"]


async def test_rerun_is_a_no_op_and_a_router_dying_before_commit_leaves_no_trace(
    started: str, pool: AsyncConnectionPool[Conn]
) -> None:
    await append_all(pool, [driver_event("a", n) for n in range(50)])
    # A router that dies before its commit: all its work is rolled back.
    async with pool.connection() as conn, conn.transaction(force_rollback=True):
        stats = RouteStats()
        assert await route_sources(conn, [DRIVER_SOURCE], stats) == 50
        assert stats.deliveries == 50
    assert await query(pool, "SELECT * FROM bus_deliveries") == []
    first = await route_until_done(pool)
    second = await route_until_done(pool)
    assert (first.routed, second.rows) == (50, 0)
    rows = await query(pool, "SELECT seq FROM bus_deliveries ORDER BY seq")
    assert [r["seq"] for r in rows] == list(range(1, 51))
    (stream,) = await query(pool, "SELECT next_seq FROM bus_streams")
    assert stream["next_seq"] == 51


async def test_filters_no_consumer_and_filter_error(pool: AsyncConnectionPool[Conn]) -> None:
    spec = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: billing}
spec:
  agents: [{name: front, model: {provider: local, name: x}}]
  triggers:
    - {kind: grpc, driver: bill, filter: {data.kind: [invoice, refund]}}
"""
    await apply_and_start(pool, spec)
    source = "grpc:bill"
    await append_all(pool, [
        driver_event("s", 1, source, kind="invoice"),
        driver_event("s", 2, source, kind="other"),
        driver_event("s", 3, source),
    ])  # fmt: skip
    bad = driver_event("s", 4, source)
    assert bad.envelope is not None
    bad.envelope["data"] = "not an object"
    await append_all(pool, [bad])
    stats = await route_until_done(pool)
    assert (stats.routed, stats.no_consumer, stats.dead) == (1, 2, 1)
    rows = await query(pool, "SELECT status, error FROM bus_ingress ORDER BY id")
    assert [r["status"] for r in rows] == ["routed", "no_consumer", "no_consumer", "dead"]
    assert rows[3]["error"].startswith("filter_error")


async def test_fan_out_to_several_employees_is_capped_at_50(
    pool: AsyncConnectionPool[Conn],
) -> None:
    template = """
apiVersion: eventos/v1
kind: Employee
metadata: {{name: e{n}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: x}}}}]
  triggers: [{{kind: grpc, driver: shared}}]
"""
    await apply_and_start(pool, "---".join(template.format(n=n) for n in range(52)))
    await append_all(pool, [driver_event("s", 1, "grpc:shared")])
    stats = await route_until_done(pool)
    assert stats.deliveries == 50
    (row,) = await query(pool, "SELECT status, error FROM bus_ingress")
    assert row["status"] == "routed"
    assert row["error"].startswith("fanout_capped")


async def test_event_accepted_right_after_start_is_delivered_once_the_generation_runs(
    spec_text: str, pool: AsyncConnectionPool[Conn]
) -> None:
    """EG12, database side."""
    await apply_and_start(pool, spec_text, activate=False)
    await asyncio.sleep(0.01)  # the scenario itself: 10 ms after Start committed
    await append_all(pool, [driver_event("late", 1)])
    await route_until_done(pool)
    (stream,) = await query(pool, "SELECT * FROM bus_streams")
    assert stream["hold_reason"] == names.HOLD_STARTING
    (delivery,) = await query(pool, "SELECT * FROM bus_deliveries")
    assert (delivery["seq"], delivery["status"]) == (1, "pending")
    async with pool.connection() as conn:
        await lifecycle.activate(conn, "support")
    (stream,) = await query(pool, "SELECT * FROM bus_streams")
    assert stream["hold_reason"] is None
    assert stream["top_pending_class"] == names.C3_INTERNAL


async def test_stop_holds_resume_releases_reset_kills(
    started: str, pool: AsyncConnectionPool[Conn]
) -> None:
    await append_all(pool, [driver_event("x", 1)])
    await route_until_done(pool)
    async with pool.connection() as conn:
        await lifecycle.stop(conn, "support")
    assert [s["hold_reason"] for s in await query(pool, "SELECT * FROM bus_streams")] == ["paused"]
    await append_all(pool, [driver_event("new-thread", 2)])
    await route_until_done(pool)
    holds = await query(pool, "SELECT hold_reason FROM bus_streams ORDER BY stream_key")
    assert [h["hold_reason"] for h in holds] == ["paused", "paused"]
    async with pool.connection() as conn:
        await lifecycle.resume(conn, "support")
    holds = await query(pool, "SELECT hold_reason FROM bus_streams")
    assert {h["hold_reason"] for h in holds} == {None}
    async with pool.connection() as conn:
        await lifecycle.reset(conn, "support")
    deliveries = await query(pool, "SELECT status, reason FROM bus_deliveries")
    assert {(d["status"], d["reason"]) for d in deliveries} == {("dead", "reset")}
    # A retired generation no longer routes.
    await append_all(pool, [driver_event("x", 3)])
    stats = await route_until_done(pool)
    assert (stats.routed, stats.no_consumer) == (0, 1)
