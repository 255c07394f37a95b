"""The append contract: durable on return, duplicates within and across batches, expiry."""

from __future__ import annotations

import asyncio
import json
import secrets

import pytest
from psycopg_pool import AsyncConnectionPool

from eventos.bus.inbox import (
    Accepted,
    Duplicate,
    GroupCommitter,
    IngressRecord,
    Rejected,
    append,
    append_isolated,
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


# --- what the one-statement append keeps ------------------------------------------------


async def dup_counts(conn: Conn) -> dict[int, int]:
    cur = await conn.execute("SELECT id, dup_count FROM bus_ingress")
    return {int(r["id"]): int(r["dup_count"]) for r in await cur.fetchall()}


async def test_duplicates_of_an_earlier_batch_in_one_batch_count_on_the_earlier_row(
    conn: Conn,
) -> None:
    (first,) = await append(conn, [record("a")])
    assert isinstance(first, Accepted)
    outcomes = await append(conn, [record("a"), record("b"), record("a")])
    assert outcomes[0] == outcomes[2] == Duplicate(first.id)
    assert isinstance(outcomes[1], Accepted)
    assert await dup_counts(conn) == {first.id: 2, outcomes[1].id: 0}


async def test_an_expired_key_twice_in_one_batch_is_taken_over_once(conn: Conn) -> None:
    (old,) = await append(conn, [record("a")])
    await conn.execute("UPDATE bus_dedupe SET expires_at = now() - interval '1 second'")
    await conn.commit()
    new, again = await append(conn, [record("a"), record("a")])
    assert isinstance(old, Accepted) and isinstance(new, Accepted)
    assert new.id > old.id
    assert again == Duplicate(new.id)
    assert await dup_counts(conn) == {old.id: 0, new.id: 1}
    cur = await conn.execute("SELECT ingress_id FROM bus_dedupe")
    assert [r["ingress_id"] for r in await cur.fetchall()] == [new.id]


async def test_outcomes_follow_the_records_order_across_sources(conn: Conn) -> None:
    (seen,) = await append(conn, [record("k1", "webhook:b")])
    batch = [record("k1", "webhook:a"), record("k1", "webhook:b"), record("k2", "webhook:a"),
             record("k1", "webhook:a"), record("k3", "webhook:c")]  # fmt: skip
    outcomes = await append(conn, batch)
    assert [type(o) for o in outcomes] == [Accepted, Duplicate, Accepted, Duplicate, Accepted]
    assert outcomes[1] == Duplicate(seen.id)
    assert outcomes[3] == Duplicate(outcomes[0].id)
    ids = [o.id for o in outcomes if isinstance(o, Accepted)]
    assert ids == sorted(ids)  # assigned in the records' order
    cur = await conn.execute("SELECT id, source_key, dedupe_key FROM bus_ingress ORDER BY id")
    stored = {r["id"]: (r["source_key"], r["dedupe_key"]) for r in await cur.fetchall()}
    for rec, outcome in zip(batch, outcomes, strict=True):
        assert stored[outcome.id] == (rec.source_key, rec.dedupe_key)


async def test_the_envelope_is_stored_as_the_same_jsonb_object(conn: Conn) -> None:
    envelope = {"id": "e1", "data": {"body": {"n": 1.5, "s": "é\u2028", "list": [None, True]}}}
    rec = IngressRecord("webhook:x", "e1", "t", "c", envelope, 10, klass=2, hop=3,
                        causation_id="cause", path="x/y", body_ref=None)  # fmt: skip
    (outcome,) = await append(conn, [rec])
    cur = await conn.execute(
        "SELECT envelope, jsonb_typeof(envelope) AS kind, envelope = %s::jsonb AS same, class,"
        " hop, causation_id, path, status, size, chain_id FROM bus_ingress WHERE id = %s",
        (json.dumps(envelope), outcome.id),
    )
    row = await cur.fetchone()
    assert row == {"envelope": envelope, "kind": "object", "same": True, "class": 2, "hop": 3,
                   "causation_id": "cause", "path": "x/y", "status": "accepted", "size": 10,
                   "chain_id": "c"}  # fmt: skip


LONG_SOURCE = "webhook:" + secrets.token_urlsafe(12_000)


def bad_records() -> dict[str, IngressRecord]:
    deep: object = "leaf"
    for _ in range(10_000):
        deep = [deep]
    return {
        "nul-in-a-nested-string": IngressRecord("webhook:x", "nul", "t", "c", {"a": ["x\x00"]}, 1),
        "nan": IngressRecord("webhook:x", "nan", "t", "c", {"x": float("nan")}, 1),
        "deep": IngressRecord("webhook:x", "deep", "t", "c", {"d": deep}, 1),
        # Incompressible and past the btree's limit: "index row size exceeds maximum" (54000).
        "over-long-source-key": IngressRecord(LONG_SOURCE, "long", "t", "c", {}, 1),
        "nul-in-a-path": IngressRecord("webhook:x", "path", "t", "c", {}, 1, path="a\x00b"),
    }


@pytest.mark.parametrize("case", list(bad_records()))
async def test_a_bad_record_among_good_ones_is_rejected_alone(conn: Conn, case: str) -> None:
    records = [record(f"k{i}") for i in range(6)]
    records.insert(3, bad_records()[case])
    outcomes = await append_isolated(conn, records)
    assert isinstance(outcomes[3], Rejected)
    good = outcomes[:3] + outcomes[4:]
    assert all(isinstance(o, Accepted) for o in good)
    cur = await conn.execute("SELECT id, dedupe_key FROM bus_ingress ORDER BY id")
    rows = await cur.fetchall()
    assert [(r["id"], r["dedupe_key"]) for r in rows] == [
        (o.id, f"k{i}") for i, o in enumerate(good)
    ]


async def test_ids_of_a_source_become_visible_in_order_under_concurrent_appends(
    pool: AsyncConnectionPool[Conn],
) -> None:
    """A reader that sees id N of a source has already seen every smaller id of it (the
    router's rule): ids are assigned in commit order."""
    done = asyncio.Event()
    seen: list[list[int]] = []

    async def writer(w: int) -> None:
        for b in range(12):
            async with pool.connection() as conn:
                await append(conn, [record(f"w{w}-{b}-{i}", "webhook:one") for i in range(4)]
                             + [record(f"w{w}-{b}-o", f"webhook:other{w}")])  # fmt: skip

    async def reader() -> None:
        async with pool.connection() as conn:
            await conn.set_autocommit(True)
            while not done.is_set():
                cur = await conn.execute(
                    "SELECT id FROM bus_ingress WHERE source_key = 'webhook:one' ORDER BY id"
                )
                seen.append([int(r["id"]) for r in await cur.fetchall()])

    reading = asyncio.create_task(reader())
    try:
        await asyncio.gather(*(writer(w) for w in range(4)))
    finally:
        done.set()
        await reading
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id FROM bus_ingress WHERE source_key = 'webhook:one'")
        final = sorted(int(r["id"]) for r in await cur.fetchall())
    assert len(final) == 4 * 12 * 4
    assert len(seen) > 1
    for snapshot in seen:
        if snapshot:
            assert snapshot == [i for i in final if i <= snapshot[-1]]
