"""Storm guards in the router on real PostgreSQL (SPEC §10, EG18), on a clock the test owns:
a loop cut at 8 hops, a cycle and a self-wake suppressed (each a dead row with its reason),
a hot edge turned into a digest with an attention item naming both employees, and the
breaker half-opening after the hour."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from conftest import apply_and_start
from messaging_helpers import landed, team
from psycopg_pool import AsyncConnectionPool
from test_data import spec as data_spec
from test_data import watcher
from test_messaging import deliveries, raw_message, route
from test_router import query

from eventos import names
from eventos.bus.inbox import append
from eventos.db import Conn
from eventos.messaging import storm
from eventos.tools import data

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


async def ingress_of(pool: AsyncConnectionPool[Conn], target: str) -> list[dict[str, object]]:
    return await query(pool, "SELECT dedupe_key, status, error, hop FROM bus_ingress "
                             "WHERE source_key = %s ORDER BY id", f"ipc:{target}")  # fmt: skip


async def test_storm_check_is_one_entry_point_with_the_callers_clock(
    pool: AsyncConnectionPool[Conn],
) -> None:
    async with pool.connection() as conn, conn.transaction():
        verdicts = [await storm.check(conn, "x", "y", "c", 1, ["x"], T0) for _ in range(22)]
        later = await storm.check(conn, "x", "y", "c", 1, ["x"], T0 + timedelta(seconds=6))
        looped = await storm.check(conn, "y", "x", "c", 2, ["x", "y"], T0)
    assert [v.action for v in verdicts] == [storm.DELIVER] * 20 + [storm.DIGEST] * 2
    assert later.action == storm.DELIVER  # 6 s at 10/min is one more token
    assert (looped.action, looped.reason) == (storm.SUPPRESS, "loop_suppressed: cycle x -> y -> x")
    (edge,) = await query(pool, "SELECT * FROM storm_edges WHERE sender = 'x'")
    assert (edge["passed"], edge["digested"], edge["exhausted_windows"]) == (21, 2, 1)


async def test_a_loop_is_cut_at_8_hops_and_cycles_and_self_wakes_are_suppressed(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b = await team(pool, "a", "b")
    async with pool.connection() as conn:
        await append(conn, [
            raw_message(a, b, 1, hop=8), raw_message(a, b, 2, hop=9),
            raw_message(b, a, 3, hop=2, path=[a, b]), raw_message(a, a, 4),
        ])  # fmt: skip
    await route(pool, T0)
    rows = {r["dedupe_key"]: r for r in [*await ingress_of(pool, b), *await ingress_of(pool, a)]}
    assert (rows[f"raw-{a}-1"]["status"], rows[f"raw-{a}-1"]["error"]) == ("routed", None)
    assert (rows[f"raw-{a}-2"]["status"], rows[f"raw-{a}-2"]["error"]) == (
        "dead",
        "loop_suppressed: hop 9",
    )
    assert (rows[f"raw-{b}-3"]["status"], rows[f"raw-{b}-3"]["error"]) == (
        "dead",
        f"loop_suppressed: cycle {a} -> {b} -> {a}",
    )
    assert (rows[f"raw-{a}-4"]["status"], rows[f"raw-{a}-4"]["error"]) == (
        "dead",
        f"loop_suppressed: self-wake {a}",
    )
    assert [d["hop"] for d in await deliveries(pool, b)] == [8]
    assert await deliveries(pool, a) == []
    items = await query(pool, "SELECT kind, ref, count FROM attention_items ORDER BY ref")
    assert {(i["kind"], i["ref"], i["count"]) for i in items} == {
        ("loop_suppressed", f"edge:{a}->{b}", 1), ("loop_suppressed", f"edge:{b}->{a}", 1),
        ("loop_suppressed", f"edge:{a}->{a}", 1)}  # fmt: skip


async def storm_minute(pool: AsyncConnectionPool[Conn], a: str, b: str, minute: int,
                       count: int, first: int) -> None:  # fmt: skip
    """`count` messages from a to b appended, routed and the digests flushed at T0+minute."""
    now = T0 + timedelta(minutes=minute)
    async with pool.connection() as conn:
        await append(conn, [raw_message(a, b, first + n) for n in range(count)])
    await route(pool, now)
    async with pool.connection() as conn:
        await storm.flush_due(conn, now)
    await route(pool, now)


async def test_a_hot_edge_becomes_a_digest_with_an_attention_item_then_half_opens(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b = await team(pool, "a", "b")
    sent = 0
    for minute in range(4):  # 40 a minute against 10 a minute (burst 20)
        await storm_minute(pool, a, b, minute, 40, sent)
        sent += 40
    (edge,) = await query(pool, "SELECT * FROM storm_edges WHERE sender = %s", a)
    assert edge["breaker"] == "open" and edge["opened_at"] == T0 + timedelta(minutes=2)
    (item,) = await query(pool, "SELECT employee, kind, ref, detail FROM attention_items")
    assert (item["kind"], item["ref"], item["employee"]) == ("breaker_open", f"edge:{a}->{b}", b)
    assert a in item["detail"] and b in item["detail"]
    one_by_one = [d for d in await deliveries(pool, b) if d["type"] == names.TYPE_IPC_MESSAGE]
    assert len(one_by_one) == 20 + 10 + 10  # the burst, then 10 a minute, then none
    # While open: nothing one by one, one digest per 15 minutes.
    await storm_minute(pool, a, b, 10, 5, sent)
    sent += 5
    await storm_minute(pool, a, b, 17, 0, sent)
    found = await deliveries(pool, b)
    digests = [d for d in found if d["type"] == names.TYPE_IPC_DIGEST]
    assert len([d for d in found if d["type"] == names.TYPE_IPC_MESSAGE]) == 40
    assert all(d["stream_key"] == f"{b}/g1/worker/{landed(a)['thread']}" for d in digests)
    assert all(d["route"]["reply"] is False for d in digests)
    counts = [d["payload"]["data"]["count"] for d in digests]
    assert sum(counts) == sent - 40  # every message is in a digest or was delivered
    last = digests[-1]["payload"]["data"]
    # Minutes 0-1 (breaker closed) went out a minute later; minutes 2-10 after 15 minutes.
    assert counts == [20 + 30, 30 + 40 + 5]
    assert len(last["texts"]) == names.STORM_DIGEST_TEXTS_MAX
    assert f"{last['count']} message(s) from {a}" in last["text"]
    statuses = {(r["status"], r["error"]) for r in await ingress_of(pool, b)}
    assert statuses <= {("routed", None), ("routed", "digested")}
    # After the hour the breaker half-opens: a probe goes through; a calm minute closes it.
    await storm_minute(pool, a, b, 2 + 61, 1, sent)
    (edge,) = await query(pool, "SELECT breaker FROM storm_edges WHERE sender = %s", a)
    assert edge["breaker"] == "half_open"
    await storm_minute(pool, a, b, 2 + 63, 1, sent + 1)
    (edge,) = await query(pool, "SELECT breaker, exhausted_windows FROM storm_edges "
                                "WHERE sender = %s", a)  # fmt: skip
    assert (edge["breaker"], edge["exhausted_windows"]) == ("closed", 0)
    one_by_one = [d for d in await deliveries(pool, b) if d["type"] == names.TYPE_IPC_MESSAGE]
    assert len(one_by_one) == 42


async def test_conversations_of_a_share_the_edges_bucket_and_each_gets_its_own_digest(
    pool: AsyncConnectionPool[Conn],
) -> None:
    """Splitting A's wakes into one thread of B per origin conversation keeps one bucket per
    pair (SPEC §10: 20 in a burst, whichever conversation wrote), and what the bucket holds
    back goes to B in one digest per thread, quoting that conversation's messages only."""
    a, b = await team(pool, "a", "b")
    origins = ("t_" + "1" * 16, "t_" + "2" * 16)
    async with pool.connection() as conn:
        await append(conn, [raw_message(a, b, n, origin=origins[n % 2]) for n in range(30)])
    await route(pool, T0)
    one_by_one = await deliveries(pool, b)
    assert len(one_by_one) == 20  # the pair's burst, not 20 per thread
    async with pool.connection() as conn:
        assert await storm.flush_due(conn, T0 + timedelta(minutes=1)) == 2
    await route(pool, T0 + timedelta(minutes=1))
    digests = [d for d in await deliveries(pool, b) if d["type"] == names.TYPE_IPC_DIGEST]
    assert sum(d["payload"]["data"]["count"] for d in digests) == 10
    for origin in origins:
        thread = landed(a, "talk", origin)["thread"]
        (digest,) = [d for d in digests if d["thread"] == thread]
        mine = {f"message {n}" for n in range(30) if origins[n % 2] == origin}
        assert set(digest["payload"]["data"]["texts"]) <= mine  # none of the other's texts
        assert all(d["payload"]["data"]["text"] in mine for d in one_by_one
                   if d["thread"] == thread)  # fmt: skip


async def test_half_open_and_still_hot_opens_again(pool: AsyncConnectionPool[Conn]) -> None:
    a, b = await team(pool, "a", "b")
    for minute in range(3):
        await storm_minute(pool, a, b, minute, 40, minute * 40)
    await storm_minute(pool, a, b, 2 + 61, 3, 200)  # the probe, then two more within a minute
    (edge,) = await query(pool, "SELECT breaker, opened_at FROM storm_edges WHERE sender = %s", a)
    assert edge["breaker"] == "open" and edge["opened_at"] == T0 + timedelta(minutes=63)
    (item,) = await query(pool, "SELECT kind, count FROM attention_items")
    assert (item["kind"], item["count"]) == ("breaker_open", 2)


async def test_watched_data_wakes_are_cut_at_8_hops_and_on_cycles(
    pool: AsyncConnectionPool[Conn],
) -> None:
    writer = f"w{uuid.uuid4().hex[:8]}"
    await apply_and_start(pool, data_spec(writer, tools="[data_get, data_put]",
                                          stores="[prices]"))  # fmt: skip
    reader = await watcher(pool)
    async with pool.connection() as conn:
        for key, hop, path in (("ok", 8, []), ("far", 9, []), ("back", 2, [reader])):
            await data.write(conn, data.Write("prices", key, 1, writer, chain_id=f"c-{key}",
                                              hop=hop, path=path))  # fmt: skip
    await route(pool, T0)
    rows = await query(pool, "SELECT envelope->'data'->>'key' AS key, status, error "
                             "FROM bus_ingress WHERE source_key = 'watch:prices'")  # fmt: skip
    notes = {r["key"]: (r["status"], r["error"]) for r in rows}
    assert notes["ok"] == ("routed", None)
    assert notes["far"][0] == "no_consumer" and "loop_suppressed: hop 9" in notes["far"][1]
    assert notes["back"][0] == "no_consumer"
    assert f"loop_suppressed: cycle {reader} -> {writer} -> {reader}" in notes["back"][1]
    got = await query(pool, "SELECT payload->'data'->>'key' AS key FROM bus_deliveries "
                            "WHERE stream_key LIKE %s", f"{reader}/%")  # fmt: skip
    assert [g["key"] for g in got] == ["ok"]
