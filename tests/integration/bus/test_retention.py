"""Retention as SPEC §15 says, on real PostgreSQL: a dead ingress row outlives its 7-day
partition (listed, replayable, its body kept) and goes at 90 days; a finished delivery goes at
30 days, a dead one at 90, one still open never; each sweep deletes a bounded batch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool
from test_dead_letters import Letters, letters  # noqa: F401 (`letters` is a fixture)
from test_router import append_all, driver_event, query

from eventos import names
from eventos.bus import blobs, retention
from eventos.db import Conn
from eventos.db.migrate import drop_expired_partitions, ensure_partitions
from eventos.db.sql import Q


async def age_ingress(pool: AsyncConnectionPool[Conn], ingress_id: int, days: int) -> None:
    """Move an ingress row `days` back, into that day's partition (made for it)."""
    async with pool.connection() as conn:
        await conn.set_autocommit(True)
        await ensure_partitions(conn, datetime.now(UTC).date() - timedelta(days=days),
                                days_ahead=0)  # fmt: skip
        await conn.execute(
            "UPDATE bus_ingress SET received_at = received_at - make_interval(days => %(d)s),"
            " routed_at = routed_at - make_interval(days => %(d)s) WHERE id = %(id)s",
            {"d": days, "id": ingress_id})  # fmt: skip


async def drop_partitions(pool: AsyncConnectionPool[Conn]) -> list[str]:
    async with pool.connection() as conn:
        await conn.set_autocommit(True)
        return await drop_expired_partitions(
            conn, datetime.now(UTC).date(), retention_days=names.INGRESS_RETENTION_DAYS
        )


async def old_dead_letter(letters: Letters) -> dict[str, Any]:  # noqa: F811
    """The `malformed` letter (its body stored apart, by body_ref), made 10 days old."""
    (letter,) = await letters.listed(reason="malformed")
    number = int(letter["id"].removeprefix("ingress-"))
    (row,) = await query(letters.pool, "SELECT body_ref FROM bus_ingress WHERE id = %s", number)
    assert row["body_ref"] is not None
    await query(letters.pool, "UPDATE event_blobs SET created_at = now() - interval '10 days'"
                " WHERE id = %s RETURNING id", row["body_ref"])  # fmt: skip
    await age_ingress(letters.pool, number, 10)
    return {**letter, "number": number, "body_ref": row["body_ref"]}


async def test_a_dead_ingress_row_outlives_its_partition_listed_and_replayable(
    letters: Letters,  # noqa: F811
) -> None:
    letter = await old_dead_letter(letters)
    (routed,) = await append_all(letters.pool, [driver_event("s", 9, f"grpc:shared-{letters.tag}")])
    await letters.route()
    await age_ingress(letters.pool, routed, 10)  # a routed row of the same old day

    dropped = await drop_partitions(letters.pool)
    assert dropped  # the 10-day-old partition went
    kept = await query(letters.pool, "SELECT id, status FROM bus_ingress_kept")
    assert kept == [{"id": letter["number"], "status": "dead"}]  # the routed row went with it
    assert [r["id"] for r in await letters.listed(reason="malformed")] == [letter["id"]]
    async with letters.pool.connection() as conn:
        assert await blobs.expire(conn) == 0  # a dead letter's body stays
        assert await retention.expire_dead_ingress(conn) == 0  # 10 days: not yet

    selector = {"ids": [letter["id"]]}
    seen = await letters.preview(selector)
    assert seen["count"] == 1 and seen["sample"][0]["id"] == letter["id"]
    done = await letters.confirm(selector, seen["confirmation"])
    assert done["replayed"] == 1
    (again,) = await query(letters.pool, "SELECT replay_of, body_ref FROM bus_ingress WHERE id = %s",
                           done["replays"][0]["as"])  # fmt: skip
    assert again == {"replay_of": letter["id"], "body_ref": letter["body_ref"]}
    async with letters.pool.connection() as conn:
        assert await blobs.read(conn, letter["body_ref"]) == b'{"broken json'
    (listed,) = await letters.listed(replayed="true")
    assert listed["id"] == letter["id"] and listed["replayed_as"] == done["replays"][0]["as"]


async def test_a_kept_dead_ingress_row_and_its_body_go_at_90_days(
    letters: Letters,  # noqa: F811
) -> None:
    letter = await old_dead_letter(letters)
    await drop_partitions(letters.pool)
    await query(letters.pool, "UPDATE bus_ingress_kept SET received_at = now() - interval '91 days',"
                " routed_at = now() - interval '91 days' RETURNING id")  # fmt: skip
    async with letters.pool.connection() as conn:
        assert await retention.expire_dead_ingress(conn) == 1
        assert await blobs.expire(conn) == 1  # nothing refers to the body any more
    assert letter["id"] not in [r["id"] for r in await letters.listed()]


async def set_delivery(
    pool: AsyncConnectionPool[Conn], delivery: int, status: str, days: int
) -> None:
    await query(pool, "UPDATE bus_deliveries SET status = %s,"
                " updated_at = now() - make_interval(days => %s) WHERE id = %s RETURNING id",
                status, days, delivery)  # fmt: skip


async def test_deliveries_go_at_30_days_dead_ones_at_90_open_ones_never(
    letters: Letters,  # noqa: F811
) -> None:
    source = f"grpc:shared-{letters.tag}"
    await append_all(letters.pool, [driver_event("s", n, source) for n in range(3, 9)])
    await letters.route()
    rows = await query(letters.pool, "SELECT id FROM bus_deliveries WHERE status <> 'dead'"
                       " ORDER BY id")  # fmt: skip
    dead = await query(letters.pool, "SELECT id FROM bus_deliveries WHERE status = 'dead'"
                       " ORDER BY id")  # fmt: skip
    done_old, done_older, done_young, pending, held, delivered = [r["id"] for r in rows[:6]]
    dead_old, dead_ancient = [r["id"] for r in dead]
    for delivery, status, days in (
        (done_old, "done", 31), (done_older, "done", 40), (done_young, "done", 29),
        (pending, "pending", 400), (held, "held", 400), (delivered, "delivered", 400),
        (dead_old, "dead", 89), (dead_ancient, "dead", 91),
    ):  # fmt: skip
        await set_delivery(letters.pool, delivery, status, days)

    async with letters.pool.connection() as conn:  # one pass: at most `limit` of each
        cur = await conn.execute(Q["deliveries_expire"], {"days": 30, "dead_days": 90, "limit": 1})
        assert (await cur.fetchone() or {})["n"] == 2
        assert await retention.expire_deliveries(conn, batch=1) == 1  # the rest, batch by batch
    left = {r["id"] for r in await query(letters.pool, "SELECT id FROM bus_deliveries")}
    assert {done_old, done_older, dead_ancient}.isdisjoint(left)
    assert {done_young, pending, held, delivered, dead_old} <= left


async def test_the_sweeps_are_served_by_their_indexes(conn: Conn) -> None:
    await conn.execute("SET enable_seqscan = off")
    for query_name, params, indexes in (
        ("deliveries_expire", {"days": 30, "dead_days": 90, "limit": 10},
         ("bus_deliveries_finished", "bus_deliveries_dead")),
        ("dead_ingress_expire", {"days": 90, "limit": 10}, ("bus_ingress_kept",)),
    ):  # fmt: skip
        cur = await conn.execute("EXPLAIN " + Q[query_name], params)
        plan = "\n".join(str(r["QUERY PLAN"]) for r in await cur.fetchall())
        assert "Seq Scan" not in plan, plan
        assert all(index in plan for index in indexes), plan
