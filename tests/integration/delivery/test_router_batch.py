"""Set-based routing (SPEC §8 step 2): what a batch of rows written by one statement keeps —
contiguous seq in ingress order per stream, fan-out, exactly once with two routers, a bad row
dead beside good ones, the payload copied as accepted, and order across the rows that still
take the one-by-one path (storm guards, watched data)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from typing import Any

from conftest import apply_and_start
from psycopg_pool import AsyncConnectionPool
from test_router import append_all, driver_event, query

from eventos import names
from eventos.bus.inbox import IngressRecord
from eventos.db import Conn
from eventos.delivery.routing import SOURCES_PER_PASS, RouteStats, route_pass, route_sources

EMPLOYEE = """
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: x}}}}]
  triggers:
{triggers}
"""


def employee(name: str, *triggers: str) -> str:
    return EMPLOYEE.format(name=name, triggers="\n".join(f"    - {t}" for t in triggers))


def record(source: str, type_: str, envelope: dict[str, Any], **extra: Any) -> IngressRecord:
    return IngressRecord(source_key=source, dedupe_key=uuid.uuid4().hex, type=type_,
                         chain_id=uuid.uuid4().hex, envelope=envelope,
                         size=len(json.dumps(envelope)), **extra)  # fmt: skip


async def route_once(pool: AsyncConnectionPool[Conn], sources: list[str]) -> RouteStats:
    """One call routing the sources' rows together: one transaction, one batch per run."""
    stats = RouteStats()
    async with pool.connection() as conn:
        await route_sources(conn, sources, stats)
    return stats


async def streams_of(pool: AsyncConnectionPool[Conn]) -> dict[str, list[dict[str, Any]]]:
    """Every stream's deliveries in seq order; each stream's seq checked contiguous from 1 and
    its next_seq one past the last."""
    rows = await query(pool, "SELECT d.stream_key, d.seq, d.ingress_id, d.subscription_id, "
                             "s.next_seq FROM bus_deliveries d JOIN bus_streams s "
                             "USING (stream_key) ORDER BY d.stream_key, d.seq")  # fmt: skip
    by_stream: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_stream.setdefault(r["stream_key"], []).append(r)
    for key, items in by_stream.items():
        assert [r["seq"] for r in items] == list(range(1, len(items) + 1)), key
        assert items[0]["next_seq"] == len(items) + 1, key
    return by_stream


async def test_a_batch_over_several_streams_with_fan_out_keeps_seq_contiguous_in_ingress_order(
    pool: AsyncConnectionPool[Conn],
) -> None:
    trigger = "{kind: grpc, driver: mix, thread_by: subject}"
    await apply_and_start(pool, employee("fan-a", trigger) + "---" + employee("fan-b", trigger))
    subjects = ["x", "y", "z", "x", "x", "z"]
    first = await append_all(
        pool, [driver_event(subjects[n % 6], n, "grpc:mix") for n in range(60)]
    )
    stats = await route_once(pool, ["grpc:mix"])
    assert (stats.routed, stats.deliveries, len(stats.streams)) == (60, 120, 6)
    # A second batch continues the same streams (they exist now) without a gap.
    second = await append_all(
        pool, [driver_event(subjects[n % 6], n, "grpc:mix") for n in range(30)]
    )
    stats = await route_once(pool, ["grpc:mix"])
    assert (stats.routed, stats.deliveries) == (30, 60)
    by_stream = await streams_of(pool)
    assert len(by_stream) == 6
    for key, items in by_stream.items():
        ids = [r["ingress_id"] for r in items]
        assert ids == sorted(ids), key
    per_row = await query(pool, "SELECT ingress_id, count(DISTINCT subscription_id) AS n "
                                "FROM bus_deliveries GROUP BY ingress_id")  # fmt: skip
    assert {r["ingress_id"]: r["n"] for r in per_row} == {i: 2 for i in first + second}


async def test_two_routers_on_one_source_at_once_route_each_row_exactly_once(
    pool: AsyncConnectionPool[Conn],
) -> None:
    trigger = "{kind: grpc, driver: race, thread_by: subject}"
    await apply_and_start(pool, employee("race-a", trigger) + "---" + employee("race-b", trigger))
    ids: list[int] = []
    busy = 0
    async with pool.connection() as one, pool.connection() as two:
        for round_ in range(15):
            recs = [driver_event(f"s{n % 4}", round_ * 20 + n, "grpc:race") for n in range(20)]
            ids += await append_all(pool, recs)
            stats = [RouteStats(), RouteStats()]
            await asyncio.gather(route_sources(one, ["grpc:race"], stats[0], rows=7),
                                 route_sources(two, ["grpc:race"], stats[1], rows=7))  # fmt: skip
            busy += stats[0].busy_sources + stats[1].busy_sources
        while await query(pool, "SELECT 1 FROM bus_ingress WHERE status = 'accepted'"):
            await route_sources(one, ["grpc:race"], RouteStats())
    per_row = await query(pool, "SELECT ingress_id, count(*) AS n FROM bus_deliveries "
                                "GROUP BY ingress_id")  # fmt: skip
    assert {r["ingress_id"]: r["n"] for r in per_row} == {i: 2 for i in ids}
    assert busy > 0  # the two did meet on the source: one skipped it while the other routed
    by_stream = await streams_of(pool)
    assert len(by_stream) == 8
    for key, items in by_stream.items():
        got = [r["ingress_id"] for r in items]
        assert got == sorted(got), key


async def test_a_bad_row_dies_with_its_reason_and_the_rows_around_it_are_routed(
    pool: AsyncConnectionPool[Conn],
) -> None:
    await apply_and_start(pool, employee("billing", "{kind: grpc, driver: bill, filter: "
                                         "{data.kind: invoice}}"))  # fmt: skip
    good = [driver_event("s", n, "grpc:bill", kind="invoice") for n in range(4)]
    bad = driver_event("s", 9, "grpc:bill")
    assert bad.envelope is not None
    bad.envelope["data"] = "not an object"
    await append_all(pool, [good[0], good[1], bad, good[2], good[3]])
    # Internal events name their own thread; a bad name is dead, the others still routed.
    placed = [record("alarm:billing", "alarm", {"id": str(n), names.ATTR_THREAD: thread})
              for n, thread in enumerate(["main", "no such thread", "main"])]  # fmt: skip
    await append_all(pool, placed)
    stats = await route_once(pool, ["grpc:bill", "alarm:billing"])
    assert (stats.routed, stats.dead, stats.deliveries) == (6, 2, 6)
    rows = await query(pool, "SELECT id, status, error FROM bus_ingress ORDER BY id")
    assert [r["status"] for r in rows] == ["routed", "routed", "dead", "routed", "routed",
                                           "routed", "dead", "routed"]  # fmt: skip
    assert rows[2]["error"] == "filter_error: data.kind: 'kind' is not inside an object"
    assert rows[6]["error"].startswith("placement_invalid: thread 'no such thread'")
    assert all(r["error"] is None for r in rows if r["status"] == "routed")
    (items,) = (await streams_of(pool)).values()  # both sources go to worker/main
    assert [r["ingress_id"] for r in items] == [r["id"] for r in rows if r["status"] == "routed"]


async def test_a_delivery_carries_the_ingress_row_as_it_was_accepted(
    started: str, pool: AsyncConnectionPool[Conn]
) -> None:
    await apply_and_start(pool, employee("plain", "{kind: grpc, driver: plain}"))
    envelope = {
        "specversion": "1.0",
        "id": "e-1",
        "source": "/drv",
        "type": "msg",
        "subject": 'ü \u2028 "quoted"',
        "data": {"n": 1.5, "list": [1, None, {"a": ""}]},
    }
    caused = {"hop": 3, "causation_id": "cause-1"}
    # One source whose routing reads the envelope (a thread per subject), one that does not.
    await append_all(pool, [record(names.source_key(names.SOURCE_GRPC, "drv-1"), "msg",
                                   envelope, **caused),
                            record("grpc:plain", "msg", envelope, **caused)])  # fmt: skip
    stats = await route_once(pool, ["grpc:drv-1", "grpc:plain"])
    assert stats.deliveries == 2
    pairs = await query(pool, "SELECT d.payload, d.type, d.size, d.chain_id, d.hop, "
                              "d.causation_id, d.body_ref, i.envelope, i.type AS i_type, "
                              "i.size AS i_size, i.chain_id AS i_chain_id FROM bus_deliveries d "
                              "JOIN bus_ingress i ON i.id = d.ingress_id")  # fmt: skip
    assert len(pairs) == 2
    for p in pairs:
        assert p["payload"] == p["envelope"] == envelope
        assert (p["type"], p["size"], p["chain_id"]) == (p["i_type"], p["i_size"], p["i_chain_id"])
        assert (p["hop"], p["causation_id"], p["body_ref"]) == (3, "cause-1", None)


async def test_rows_routed_one_by_one_keep_their_place_among_batched_rows(
    pool: AsyncConnectionPool[Conn],
) -> None:
    """Storm-guarded wakes (`ipc:`) and watched changes take the one-by-one path; rows of other
    sources in the same pass land in the same stream around them without a gap."""
    await apply_and_start(pool, employee("mixer", "{kind: grpc, driver: mix-a}",
                                         "{kind: grpc, driver: mix-b}",
                                         "{kind: watch, store: prices}"))  # fmt: skip
    a = await append_all(pool, [driver_event("s", n, "grpc:mix-a") for n in range(3)])
    change = {
        "id": "c-1",
        "type": "data.prices.changed",
        "data": {"store": "prices", "key": "sku-1", "version": 1, "writer": ""},
    }
    watched = await append_all(pool, [record("watch:prices", "data.prices.changed", change)])
    wake = {
        "id": "w-1",
        names.ATTR_LANE: names.LANE_WORKER,
        names.ATTR_THREAD: "main",
        "data": {"text": "from the platform"},
    }
    wakes = await append_all(
        pool,
        [
            record("ipc:mixer", names.TYPE_IPC_MESSAGE, wake),
            record("ipc:mixer", names.TYPE_IPC_MESSAGE, wake),
        ],
    )
    b = await append_all(pool, [driver_event("s", n, "grpc:mix-b") for n in range(3)])
    stats = await route_once(pool, ["grpc:mix-a", "watch:prices", "ipc:mixer", "grpc:mix-b"])
    assert (stats.routed, stats.deliveries) == (9, 9)
    (items,) = (await streams_of(pool)).values()
    assert [r["ingress_id"] for r in items] == a + watched + wakes + b
    pending = await query(pool, "SELECT stream_key, seq FROM watch_pending")
    assert [(p["stream_key"], p["seq"]) for p in pending] == [(items[3]["stream_key"], 4)]


async def test_the_owners_chat_is_routed_in_the_first_pass_behind_a_backlog_of_other_sources(
    pool: AsyncConnectionPool[Conn],
) -> None:
    """More background sources than a pass takes, all older than the owner's message: the pass
    takes the chat's source first (class C1), then the oldest of the others."""
    backlog = [driver_event("bg", n, source=f"grpc:drv-{n}") for n in range(SOURCES_PER_PASS + 5)]
    await append_all(pool, [dataclasses.replace(r, klass=names.C4_BACKGROUND) for r in backlog])
    chat = record(names.source_key(names.SOURCE_CHAT, "someone"), "chat.message",
                  {"data": {"text": "hi"}}, klass=names.C1_OWNER)  # fmt: skip
    (chat_id,) = await append_all(pool, [chat])
    async with pool.connection() as conn:
        await route_pass(conn)
    rows = await query(pool, "SELECT id, source_key, status FROM bus_ingress ORDER BY id")
    left = [r["source_key"] for r in rows if r["status"] == "accepted"]
    assert [r["status"] for r in rows if r["id"] == chat_id] != ["accepted"]
    # The other sources of the pass were the oldest: those left over are the newest.
    assert left == [r.source_key for r in backlog][SOURCES_PER_PASS - 1 :]
