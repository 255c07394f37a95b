"""The relay asks for its boot re-arm even when PostgreSQL answers only later, or is migrated only
later (on a cluster the relay may start first, and before the chart's migration Job with the
bundled PostgreSQL): it waits, says why, and asks once the database is there."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import uuid

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tcp_relay import relay

from eventos import names
from eventos.control.intent_deliverer import ask_rearm
from eventos.db import connect, open_pool
from eventos.db.migrate import migrate
from eventos.settings import DatabaseSettings
from eventos.testing import wait_for
from eventos.testing.plugin import PostgresForTests


async def rearms(settings: DatabaseSettings) -> int:
    conn = await connect(settings)
    async with conn:
        cur = await conn.execute("SELECT count(*) AS n FROM intents WHERE kind = %s",
                                 (names.INTENT_REARM,))  # fmt: skip
        return int((await cur.fetchone() or {})["n"])


async def test_the_boot_rearm_waits_for_a_database_that_answers_late(
    db_settings: DatabaseSettings, caplog: pytest.LogCaptureFixture
) -> None:
    real = conninfo_to_dict(db_settings.url)

    async def to_real(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay(reader, writer, real["host"], int(real["port"]))

    # Bound but not listening: every connection is refused until the "database" starts.
    late = socket.socket()
    late.bind(("127.0.0.1", 0))
    port = late.getsockname()[1]
    late_url = make_conninfo(db_settings.url, host="127.0.0.1", port=str(port))
    settings = dataclasses.replace(db_settings, url=late_url)
    pool = await open_pool(settings, wait=False)
    caplog.set_level(logging.WARNING, logger="eventos.control.intent_deliverer")
    task = asyncio.create_task(ask_rearm(pool))

    async def waiting_said() -> bool:
        return "the database does not answer" in caplog.text

    server = None
    try:
        await wait_for(waiting_said, timeout=60, what="a logged wait for the database")
        assert not task.done()  # still trying, not failed
        server = await asyncio.start_server(to_real, sock=late)
        await asyncio.wait_for(task, 90)
        assert await rearms(db_settings) == 1
    finally:
        task.cancel()
        await pool.close()
        if server is not None:
            server.close()
        late.close()


async def test_the_boot_rearm_waits_for_the_migration(
    postgres_server: PostgresForTests, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"unmigrated_{uuid.uuid4().hex[:8]}"
    postgres_server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    settings = DatabaseSettings(url=postgres_server.url(name))
    pool = await open_pool(settings)
    caplog.set_level(logging.WARNING, logger="eventos.control.intent_deliverer")
    task = asyncio.create_task(ask_rearm(pool))

    async def waiting_said() -> bool:
        return "the database is not migrated yet" in caplog.text

    try:
        await wait_for(waiting_said, timeout=60, what="a logged wait for the migration")
        assert not task.done()  # still trying, not failed
        conn = await connect(settings)
        async with conn:
            await migrate(conn)
        await asyncio.wait_for(task, 90)
        assert await rearms(settings) == 1
    finally:
        task.cancel()
        await pool.close()
        postgres_server.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
