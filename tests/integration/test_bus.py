"""The append contract: durable on return, duplicates within and across batches, expiry."""

from __future__ import annotations

import asyncio

import pytest
from psycopg_pool import AsyncConnectionPool

from eventos.bus import (
    Accepted,
    Duplicate,
    GroupCommitter,
    IngressRecord,
    Rejected,
    append,
    bounded_dedupe_key,
)
from eventos.db import Conn
from eventos.errors import DatabaseUnavailable, QueueFull
from eventos.testing import wait_for
from eventos.testing.plugin import PostgresForTests


def record(key: str, source: str = "webhook:x") -> IngressRecord:
    return IngressRecord(source, key, "t", f"chain-{key}", {"k": key}, 10)


async def test_a_duplicate_inside_one_batch_points_at_the_first(conn: Conn) -> None:
    outcomes = await append(conn, [record("a"), record("b"), record("a")])
    assert isinstance(outcomes[0], Accepted)
    assert isinstance(outcomes[1], Accepted)
    assert outcomes[2] == Duplicate(outcomes[0].id)
    cur = await conn.execute("SELECT dedupe_key, dup_count FROM bus_ingress ORDER BY id")
    assert await cur.fetchall() == [
        {"dedupe_key": "a", "dup_count": 1},
        {"dedupe_key": "b", "dup_count": 0},
    ]


async def test_an_expired_key_is_a_new_event(conn: Conn) -> None:
    (first,) = await append(conn, [record("a")])
    await conn.execute("UPDATE bus_dedupe SET expires_at = now() - interval '1 second'")
    await conn.commit()
    (second,) = await append(conn, [record("a")])
    assert isinstance(second, Accepted)
    assert isinstance(first, Accepted)
    assert second.id != first.id


async def test_group_commit_answers_each_caller_with_its_own_outcome(
    pool: AsyncConnectionPool[Conn],
) -> None:
    committer = GroupCommitter(pool, workers=2)
    committer.start()
    try:
        keys = [f"k{i % 150}" for i in range(300)]  # every key twice
        outcomes = await asyncio.gather(
            *(committer.submit(record(k, f"webhook:s{i % 3}")) for i, k in enumerate(keys))
        )
    finally:
        await committer.stop()
    accepted = [o for o in outcomes if isinstance(o, Accepted)]
    assert len(accepted) == 150  # keys repeat on the same source (150 is a multiple of 3)
    assert sum(isinstance(o, Duplicate) for o in outcomes) == 150
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM bus_ingress")
        assert (await cur.fetchone() or {})["n"] == len(accepted)
        cur = await conn.execute("SELECT id FROM bus_ingress")
        assert {r["id"] for r in await cur.fetchall()} == {o.id for o in accepted}


def unstorable(key: str) -> IngressRecord:
    """A record PostgreSQL itself refuses (jsonb has no NUL character): its own fault."""
    return IngressRecord("webhook:x", key, "t", f"chain-{key}", {"k": "a\x00b"}, 10)


async def queued(committer: GroupCommitter, n: int) -> None:
    async def reached() -> bool:
        return committer.depth == n

    await wait_for(reached, what=f"{n} records queued")


async def stored_keys(pool: AsyncConnectionPool[Conn]) -> list[str]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM bus_ingress ORDER BY dedupe_key")
        return [str(r["dedupe_key"]) for r in await cur.fetchall()]


async def test_a_record_postgresql_refuses_fails_alone_in_its_batch(
    pool: AsyncConnectionPool[Conn],
) -> None:
    committer = GroupCommitter(pool, workers=1, max_batch=64)
    records = [record(f"k{i:02}") for i in range(10)]
    records.insert(5, unstorable("bad"))
    records.insert(8, IngressRecord("webhook:x", "surrogate", "t", "c", {"k": "\ud800"}, 1))
    # Queued before the worker starts, so they share one batch.
    futures = [asyncio.ensure_future(committer.submit(r)) for r in records]
    await queued(committer, len(records))
    committer.start()
    try:
        outcomes = await asyncio.wait_for(asyncio.gather(*futures), 30)
    finally:
        await committer.stop()
    rejected = [r.dedupe_key for r, o in zip(records, outcomes, strict=True)
                if isinstance(o, Rejected)]  # fmt: skip
    assert rejected == ["bad", "surrogate"]
    assert all(isinstance(o, Accepted) for o in outcomes if not isinstance(o, Rejected))
    assert await stored_keys(pool) == [f"k{i:02}" for i in range(10)]


async def test_a_connection_error_fails_the_whole_batch_as_unavailable(
    pool: AsyncConnectionPool[Conn], postgres_server: PostgresForTests, db_name: str
) -> None:
    committer = GroupCommitter(pool, workers=1)
    committer.start()
    try:
        with postgres_server.unavailable(db_name):
            results = await asyncio.gather(
                *[committer.submit(record(f"u{i}")) for i in range(3)], return_exceptions=True
            )
    finally:
        await committer.stop()
    assert all(isinstance(r, DatabaseUnavailable) for r in results), results


async def test_the_commit_queue_is_bounded(pool: AsyncConnectionPool[Conn]) -> None:
    committer = GroupCommitter(pool, workers=1, max_queue=2)  # not started: nothing drains
    waiting = [asyncio.ensure_future(committer.submit(record(f"q{i}"))) for i in range(2)]
    await queued(committer, 2)
    with pytest.raises(QueueFull):
        await committer.submit(record("q-over"))
    committer.start()
    try:
        assert all(isinstance(o, Accepted) for o in await asyncio.gather(*waiting))
    finally:
        await committer.stop()
    assert await stored_keys(pool) == ["q0", "q1"]


def test_a_long_or_unstorable_dedupe_key_is_a_stable_hash() -> None:
    long = "x" * 600
    assert bounded_dedupe_key("evt_1") == "evt_1"
    assert bounded_dedupe_key(long) == bounded_dedupe_key(long)
    assert bounded_dedupe_key(long).startswith("key-sha256:")
    assert bounded_dedupe_key(long) != bounded_dedupe_key(long + "y")
    assert bounded_dedupe_key("a\x00").startswith("key-sha256:")
    assert bounded_dedupe_key("\ud800").startswith("key-sha256:")
