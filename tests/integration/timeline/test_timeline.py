"""The employee timeline's API on a real database: filters, pages that neither skip nor repeat a
row while rows arrive (late commits and inputs accepted before they are routed included),
retention, refusals, and pages that stay index-driven on 100,000 rows."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN
from psycopg_pool import AsyncConnectionPool
from test_router import append_all, driver_event, query, route_until_done

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.testing import wait_for
from eventos.testing.timeline import bulk_timeline
from eventos.timeline import entries

NAME = "support"  # conftest's `started` employee: a gRPC driver threaded by subject


@pytest.fixture
async def api(ingress_url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=30) as c:
        yield c


async def get(api: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    r = await api.get(f"/v1/employees/{NAME}/timeline", params=params)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def walk(api: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    """Every page in one order until `next_cursor` is null."""
    listed: list[dict[str, Any]] = []
    page = await get(api, **params)
    listed += page["timeline"]
    while page["next_cursor"] is not None:
        page = await get(api, cursor=page["next_cursor"], limit=params.get("limit", 50))
        listed += page["timeline"]
    return listed


async def ids_in_db(pool: AsyncConnectionPool[Conn], where: str = "", *args: object) -> list[int]:
    q = f"SELECT id FROM employee_timeline WHERE employee = %s {where} ORDER BY at, id"
    return [int(r["id"]) for r in await query(pool, q, NAME, *args)]


def key(e: dict[str, Any]) -> tuple[datetime, int]:
    return (datetime.fromisoformat(e["at"]), int(e["id"]))


async def raise_item(conn: Conn, ref: str) -> None:
    """Any fact with a timeline entry: an attention item (its trigger writes the entry)."""
    await conn.execute(Q["attention_raise"], {"employee": NAME, "kind": "test_item",
                                              "severity": "info", "ref": ref, "detail": None})  # fmt: skip


async def test_filters_by_thread_chain_kind_and_time(
    api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn], started: str
) -> None:
    async with pool.connection() as conn:
        await bulk_timeline(conn, NAME, 2000, spread_s=3600)
        await bulk_timeline(conn, "someone-else", 500, spread_s=3600)
    everything = await walk(api, limit=200)
    assert [e["id"] for e in reversed(everything)] == await ids_in_db(pool)
    assert all(key(a) > key(b) for a, b in itertools.pairwise(everything))

    main = await walk(api, thread="main", limit=77)
    assert [e["id"] for e in reversed(main)] == await ids_in_db(pool, "AND thread = 'main'")

    chain = await walk(api, chain=f"bulk-{NAME}-5", order="oldest")
    assert [e["kind"] for e in chain] == ["input.accepted", "input.routed", "input.delivered",
                                          "turn.started", "turn.done", "reply.queued",
                                          "reply.sent"]  # fmt: skip
    assert {e["chain_id"] for e in chain} == {f"bulk-{NAME}-5"}
    assert chain[4]["summary"] == "turn 5 done: 2 steps, 1,234 tokens, $0.0012"
    assert chain[0]["summary"] == "webhook stripe accepted"

    turns = await walk(api, kind="turn", limit=33)
    assert {e["kind"] for e in turns} == {"turn.started", "turn.done"}
    assert [e["id"] for e in reversed(turns)] == await ids_in_db(pool, "AND kind LIKE 'turn.%%'")
    done = await walk(api, kind="turn.done,reply.sent", order="oldest", limit=41)
    assert [e["id"] for e in done] == await ids_in_db(
        pool, "AND kind IN ('turn.done', 'reply.sent')"
    )

    rows = await query(pool, "SELECT min(at) + (max(at) - min(at)) / 3 AS a, "
                       "min(at) + (max(at) - min(at)) / 2 AS b FROM employee_timeline")  # fmt: skip
    since, until = rows[0]["a"], rows[0]["b"]
    window = await walk(api, since=since.isoformat(), until=until.isoformat(), limit=100)
    assert window and all(since <= datetime.fromisoformat(e["at"]) < until for e in window)
    assert [e["id"] for e in reversed(window)] == await ids_in_db(
        pool, "AND at >= %s AND at < %s", since, until
    )


async def test_pages_neither_skip_nor_repeat_while_inputs_arrive_and_route(
    api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn], started: str
) -> None:
    """Writers append inputs and route them a moment later (their `accepted` entries carry the
    older time of their ingress rows) while readers page both ways and follow."""
    async with pool.connection() as conn:
        await bulk_timeline(conn, NAME, 300, spread_s=60)
    top = await get(api, limit=1)
    stop = asyncio.Event()

    async def write() -> None:
        n = 0
        while not stop.is_set():
            await append_all(pool, [driver_event(f"s{n % 4}", n) for _ in range(3)])
            await route_until_done(pool)
            n += 1

    writer = asyncio.create_task(write())
    try:
        newest = await walk(api, limit=23)
        oldest: list[dict[str, Any]] = []
        page = await get(api, order="oldest", limit=29)
        for _ in range(40):  # follow while the writer runs
            oldest += page["timeline"]
            cursor = page["next_cursor"] or page["follow_cursor"]
            page = await get(api, cursor=cursor, limit=29)
    finally:
        stop.set()
        await writer
    everything = await ids_in_db(pool)

    async def caught_up() -> bool:
        nonlocal page
        oldest.extend(page["timeline"])
        cursor = page["next_cursor"] or page["follow_cursor"]
        page = await get(api, cursor=cursor, limit=200)
        return len(oldest) + len(page["timeline"]) >= len(everything)

    await wait_for(caught_up, timeout=30, what="the follower caught up")
    oldest += page["timeline"]
    assert [e["id"] for e in oldest] == everything  # each once, in order
    # Newest first from the first page's top: every row up to it, each once.
    first_top = key(newest[0])
    assert first_top >= key(top["timeline"][0])
    before = [i for i, e in zip(everything, sorted(oldest, key=key), strict=True)
              if key(e) <= first_top]  # fmt: skip
    assert [e["id"] for e in reversed(newest)] == before
    assert len(everything) > 300 + 40  # the writer added rows meanwhile


async def test_an_input_accepted_before_it_is_routed_is_not_passed_by_a_follower(
    api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn], started: str
) -> None:
    """Its `accepted` entry carries the ingress row's time but is written when it is routed:
    the list stops before that time while the row waits, then goes on with it."""
    (ingress_id,) = await append_all(pool, [driver_event("late", 1)])
    async with pool.connection() as conn:
        await raise_item(conn, "after-the-append")
    page = await get(api, order="oldest")
    assert [e["kind"] for e in page["timeline"]] == []  # held back: the input may still come
    follow = page["follow_cursor"]
    await route_until_done(pool)
    page = await get(api, cursor=follow)
    kinds = [e["kind"] for e in page["timeline"]]
    assert kinds == ["input.accepted", "attention.raised", "input.routed"]
    assert page["timeline"][0]["detail"]["ingress"] == ingress_id


async def test_an_entry_committed_late_is_not_passed_by_a_follower(
    api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn], started: str
) -> None:
    """A transaction writes an entry, another commits a later one first: the list stops at the
    open transaction's start until it commits."""
    async with pool.connection() as slow, pool.connection() as fast:
        await raise_item(slow, "slow")  # its transaction stays open
        await raise_item(fast, "fast")
        await fast.commit()
        page = await get(api, order="oldest")
        assert page["timeline"] == []
        follow = page["follow_cursor"]
        await slow.commit()
    page = await get(api, cursor=follow)
    assert [e["detail"]["attention"] for e in page["timeline"]] == ["test_item", "test_item"]
    refs = await query(pool, "SELECT id FROM attention_items ORDER BY id")
    assert [e["ref"] for e in page["timeline"]] == [str(r["id"]) for r in refs]


async def test_entries_past_30_days_are_not_shown_and_the_sweep_deletes_them(
    api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn], started: str
) -> None:
    async with pool.connection() as conn:
        for days in (31, 29):
            await conn.execute("INSERT INTO employee_timeline (employee, at, kind, ref) "
                               "VALUES (%s, now() - make_interval(days => %s), 'turn.done', %s)",
                               (NAME, days, f"{days}d"))  # fmt: skip
    shown = await walk(api, since="2000-01-01T00:00:00+00:00")
    assert [e["ref"] for e in shown] == ["29d"]
    async with pool.connection() as conn:
        assert await entries.expire(conn, batch=1) == 1
    left = await query(pool, "SELECT ref FROM employee_timeline")
    assert left == [{"ref": "29d"}]


async def test_refusals(
    api: httpx.AsyncClient, ingress_url: str, pool: AsyncConnectionPool[Conn], started: str
) -> None:
    async def problem(path: str, status: int, **params: Any) -> dict[str, Any]:
        r = await api.get(path, params=params)
        assert r.status_code == status, (params, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        return r.json()  # type: ignore[no-any-return]

    base = f"/v1/employees/{NAME}/timeline"
    await problem("/v1/employees/nobody/timeline", 404)
    await problem("/v1/employees/nobody/waiting", 404)
    for bad in ({"limit": "0"}, {"limit": "201"}, {"limit": "x"}, {"cursor": "garbage"},
                {"cursor": "W10"}, {"kind": "turn.exploded"}, {"since": "yesterday"},
                {"until": "2026-01-01T00:00:00"}, {"order": "sideways"}, {"chain": "c" * 201},
                {"cursor": "A" * 400}):  # fmt: skip
        doc = await problem(base, 400, **bad)
        assert doc["errors"][0]["path"] == next(iter(bad)), bad
    newest = (await get(api))["follow_cursor"]  # an `oldest` cursor
    await problem(base, 400, cursor=newest, order="newest")
    r = await api.post("/v1/users", json={"name": "alice"})
    user = {"Authorization": f"Bearer {r.json()['token']}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=user) as alice:
        for path in (base, f"/v1/employees/{NAME}/waiting"):
            assert (await alice.get(path)).status_code == 403
    async with httpx.AsyncClient(base_url=ingress_url) as nobody:
        assert (await nobody.get(base)).status_code == 401


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


async def explain(conn: Conn, name: str, **overrides: Any) -> list[dict[str, Any]]:
    horizon = await entries.horizon(conn, NAME)
    params: dict[str, Any] = {
        "employee": NAME, "thread": None, "chain": None, "kinds": [], "limit": 51,
        "since": horizon - timedelta(days=30), "until": horizon, "before_at": None,
        "before_id": None, "after_at": None, "after_id": None, **overrides,
    }  # fmt: skip
    cur = await conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + Q[name].encode(), params,
                             prepare=False)  # fmt: skip
    row = await cur.fetchone()
    assert row is not None
    doc = row["QUERY PLAN"]
    return plan_nodes((json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"])


async def test_a_page_stays_index_driven_on_100000_rows(
    pool: AsyncConnectionPool[Conn], started: str
) -> None:
    """EXPLAIN ANALYZE of every page shape on an employee with 100,000 entries (and others'):
    an index walked for the page's rows only, never a scan or a sort of the timeline."""
    async with pool.connection() as conn:
        await bulk_timeline(conn, NAME, 100_000)
        await bulk_timeline(conn, "someone-else", 20_000)
        await conn.execute("ANALYZE employee_timeline")
        middle = datetime.now(UTC) - timedelta(days=3)
        shapes = {
            "top": await explain(conn, "timeline_newest"),
            "middle": await explain(conn, "timeline_newest", before_at=middle, before_id=2**62),
            "oldest": await explain(conn, "timeline_oldest", after_at=middle, after_id=0),
            "thread": await explain(conn, "timeline_newest", thread="main"),
            "kinds": await explain(
                conn, "timeline_newest_of_kinds", kinds=list(names.TIMELINE_KINDS["turn"])
            ),
            "chain": await explain(conn, "timeline_newest", chain=f"bulk-{NAME}-777"),
        }
    for shape, nodes in shapes.items():
        types = {n["Node Type"] for n in nodes}
        assert "Seq Scan" not in types, shape
        scanned = sum(n["Actual Rows"] * n["Actual Loops"] for n in nodes
                      if "Index" in n["Node Type"] or n["Node Type"] == "Bitmap Heap Scan")  # fmt: skip
        assert scanned <= 5 * 52, (shape, scanned)  # the page's rows (a few kinds' pages)
        assert nodes[0]["Actual Rows"] == (7 if shape == "chain" else 51), shape


async def test_the_append_path_writes_no_timeline_row(
    pool: AsyncConnectionPool[Conn], started: str
) -> None:
    """EG8: what ingress writes to accept an event (the ingress row and its partitions, the
    dedupe key, an owner message, a body) carries no trigger: an appended input has no entry
    until the router routes it."""
    found = await query(pool, "SELECT c.relname FROM pg_trigger t JOIN pg_class c "
                        "ON c.oid = t.tgrelid WHERE NOT t.tgisinternal AND c.relname ~ "
                        "'^(bus_ingress|bus_dedupe|chat_messages|event_blob)'")  # fmt: skip
    assert found == []
    await append_all(pool, [driver_event("quiet", 1)])
    assert await query(pool, "SELECT kind FROM employee_timeline") == []
    await route_until_done(pool)
    kinds = await query(pool, "SELECT kind FROM employee_timeline ORDER BY at, id")
    assert [k["kind"] for k in kinds] == ["input.accepted", "input.routed"]
