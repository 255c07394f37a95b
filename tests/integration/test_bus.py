"""The append contract: durable on return, duplicates within and across batches, expiry."""

from __future__ import annotations

import asyncio

from psycopg_pool import AsyncConnectionPool

from eventos.bus import Accepted, Duplicate, GroupCommitter, IngressRecord, append
from eventos.db import Conn


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
