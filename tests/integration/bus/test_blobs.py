"""Bodies over 64 KB in PostgreSQL (SPEC §5, §15): chunked, read back whole, kept 7 days, or 90
while a dead delivery refers to them."""

from __future__ import annotations

import os

from psycopg_pool import AsyncConnectionPool

from eventos.bus import blobs, retention
from eventos.db import Conn


async def test_a_body_is_written_in_chunks_and_read_back_whole(
    pool: AsyncConnectionPool[Conn],
) -> None:
    body = os.urandom(3 * blobs.CHUNK_BYTES + 17)
    async with pool.connection() as conn:
        ref = await blobs.store(conn, body)
        assert await blobs.read(conn, ref) == body
        assert await blobs.blob_exists(conn, ref)
        cur = await conn.execute("SELECT n, length(content) AS size FROM event_blob_chunks "
                                 "WHERE blob_id = %s ORDER BY n", (ref,))  # fmt: skip
        sizes = [r["size"] for r in await cur.fetchall()]
    assert sizes == [blobs.CHUNK_BYTES] * 3 + [17]


async def test_a_spooled_body_is_stored_from_its_file(pool: AsyncConnectionPool[Conn]) -> None:
    spool = blobs.Spool()
    body = os.urandom(blobs.SPOOL_MEMORY_BYTES * 5)
    for i in range(0, len(body), 10_000):
        await spool.write(body[i : i + 10_000])
    assert not spool.in_memory
    async with pool.connection() as conn:
        ref = await blobs.store(conn, spool)
        assert await blobs.read(conn, ref) == body
        cur = await conn.execute("SELECT sha256, size FROM event_blobs WHERE id = %s", (ref,))
        row = await cur.fetchone()
    spool.close()
    assert row == {"sha256": spool.sha256, "size": len(body)}


async def test_retention_keeps_what_a_dead_letter_may_replay(
    pool: AsyncConnectionPool[Conn], started: str
) -> None:
    async with pool.connection() as conn:
        refs = {name: await blobs.store(conn, name.encode() * 10) for name in
                ("fresh", "old", "old-dead", "ancient-dead")}  # fmt: skip
        ages = {"fresh": 1, "old": 8, "old-dead": 8, "ancient-dead": 91}
        for name, days in ages.items():
            await conn.execute("UPDATE event_blobs SET created_at = now() - make_interval(days => %s)"
                               " WHERE id = %s", (days, refs[name]))  # fmt: skip
        await conn.execute("INSERT INTO bus_streams (stream_key, employee, generation, lane, thread,"
                           " entity_id) VALUES ('s', 'support', 1, 'worker', 'main', 'e')")  # fmt: skip
        sub = await (await conn.execute("SELECT id FROM bus_subscriptions LIMIT 1")).fetchone()
        assert sub is not None
        for seq, name in enumerate(("old-dead", "ancient-dead"), start=1):
            await conn.execute(
                "INSERT INTO bus_deliveries (stream_key, seq, ingress_id, ingress_received_at,"
                " subscription_id, route, class, thread, type, body_ref, size, chain_id, hop,"
                " status, updated_at) VALUES ('s', %s, %s, now(), %s, '{}', 4, 'main', 't', %s,"
                " 1, 'c', 0, 'dead', now() - make_interval(days => %s))",
                (seq, seq, sub["id"], refs[name], ages[name]))  # fmt: skip
        await conn.commit()
        assert await blobs.expire(conn) == 1  # a body stays while its dead letter does
        assert await retention.expire_deliveries(conn) == 1  # the letter dead 91 days ago
        assert await blobs.expire(conn) == 1
        left = {name for name, ref in refs.items() if await blobs.blob_exists(conn, ref)}
        cur = await conn.execute("SELECT count(*) AS n FROM event_blob_chunks")
        chunks = (await cur.fetchone() or {})["n"]
    assert left == {"fresh", "old-dead"}
    assert chunks == 2  # the chunks went with their rows
