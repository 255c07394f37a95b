"""Migration 0029 on a database as an instance had it before: the deliveries earlier Resets left
`delivered` for ever (and the owner's messages among them) are settled `dead(reset)`; a live
generation's are left alone; every employee is kept (none deleted)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from psycopg import sql

from eventos.db import Conn, connect
from eventos.db.migrate import migrate, shipped_migrations
from eventos.db.sql import Q
from eventos.settings import DatabaseSettings
from eventos.testing.plugin import PostgresForTests

BEFORE = 29


@pytest.fixture
async def before_0029(postgres_server: PostgresForTests) -> AsyncIterator[DatabaseSettings]:
    """A database migrated up to 0028."""
    name = f"pre0029_{uuid.uuid4().hex[:8]}"
    postgres_server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    settings = DatabaseSettings(url=postgres_server.url(name))
    conn = await connect(settings, autocommit=True)
    async with conn:
        await conn.execute(Q["migration_table_create"])
        for m in shipped_migrations():
            if m.version < BEFORE:
                await conn.execute(m.text.encode())
                await conn.execute(Q["migration_record"], {"version": m.version, "name": m.name,
                                                           "checksum": m.checksum})  # fmt: skip
    yield settings
    postgres_server.execute(
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


async def stream_with(conn: Conn, generation: int, statuses: list[str]) -> None:
    """Generation `generation` of `ann` in that state's stream, one owner message per status."""
    key = f"ann/g{generation}/talk/main"
    await conn.execute(
        "INSERT INTO bus_subscriptions (employee, generation, trigger_name, trigger_kind, "
        "event_types, source_key, class, lane, agent, reply_capable) VALUES ('ann', %s, 'chat', "
        "'chat', '{chat.message}', 'chat:ann', 1, 'talk', 'front', true)",
        (generation,),
    )
    await conn.execute("INSERT INTO bus_streams (stream_key, employee, generation, lane, thread, "
                       "entity_id) VALUES (%s, 'ann', %s, 'talk', 'main', %s)",
                       (key, generation, f"conv-{generation}"))  # fmt: skip
    for seq, status in enumerate(statuses, start=1):
        ingress_id = generation * 100 + seq
        await conn.execute(
            "INSERT INTO bus_deliveries (stream_key, seq, ingress_id, ingress_received_at, "
            "subscription_id, route, class, thread, type, size, chain_id, hop, status) "
            "SELECT %s, %s, %s, now(), max(id), '{}', 1, 'main', 'chat.message', 2, %s, 0, %s "
            "FROM bus_subscriptions",
            (key, seq, ingress_id, f"c{ingress_id}", status),
        )
        chat = {"pending": "queued", "delivered": "delivered", "done": "answered"}[status]
        await conn.execute("INSERT INTO chat_messages (employee, session, client_message_id, "
                           "text, status, ingress_id) VALUES ('ann', 'main', %s, 'hi', %s, %s)",
                           (f"m{ingress_id}", chat, ingress_id))  # fmt: skip


async def test_0029_settles_what_earlier_resets_left_open(before_0029: DatabaseSettings) -> None:
    conn = await connect(before_0029, autocommit=True)
    async with conn:
        await conn.execute("INSERT INTO employees (name, spec, spec_sha256) "
                           "VALUES ('ann', '{}', 'x')")  # fmt: skip
        for generation, state in ((1, "retired"), (2, "running")):
            await conn.execute("INSERT INTO generations (employee, generation, state, spec, "
                               "spec_sha256) VALUES ('ann', %s, %s, '{}', 'x')",
                               (generation, state))  # fmt: skip
            await stream_with(conn, generation, ["done", "delivered", "delivered", "pending"])
        applied = [m.version for m in await migrate(conn)]
        assert applied[0] == BEFORE  # 0029 first (later migrations follow it)
        cur = await conn.execute("SELECT d.ingress_id, d.status, d.reason, m.status AS chat "
                                 "FROM bus_deliveries d JOIN chat_messages m USING (ingress_id) "
                                 "ORDER BY d.ingress_id")  # fmt: skip
        rows = [
            (r["ingress_id"], r["status"], r["reason"], r["chat"]) for r in await cur.fetchall()
        ]
        cur = await conn.execute("SELECT name, deleted_at FROM employees")
        employees = await cur.fetchall()
    assert rows == [
        (101, "done", None, "answered"),  # consumed: left alone
        (102, "dead", "reset", "dead"), (103, "dead", "reset", "dead"),
        (104, "dead", "reset", "dead"),
        (201, "done", None, "answered"),  # the live generation's: untouched
        (202, "delivered", None, "delivered"), (203, "delivered", None, "delivered"),
        (204, "pending", None, "queued"),
    ]  # fmt: skip
    assert employees == [{"name": "ann", "deleted_at": None}]
