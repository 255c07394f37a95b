"""Stream wake-ups (LISTEN/NOTIFY): a committed chat event, once placed, wakes its employee's streams, and
only theirs; a listener whose connection dies says so (the streams poll) and comes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn
from eventos.owner.wakeups import StreamWakeups
from eventos.runtime.service import cancel_and_wait
from eventos.settings import DatabaseSettings
from eventos.testing import wait_for

EVENT = """
INSERT INTO chat_events (employee, session, kind, turn_id, dedupe_key, text)
VALUES (%s, 'owner', 'notice', '', gen_random_uuid()::text, 'hi')
"""


async def listening(wakeups: StreamWakeups, state: bool) -> bool:
    return wakeups.listening is state


@pytest.fixture
async def wakeups(db_settings: DatabaseSettings) -> AsyncIterator[StreamWakeups]:
    w = StreamWakeups(db_settings)
    task = asyncio.create_task(w.run())
    await wait_for(lambda: listening(w, True), timeout=10, what="listening")
    yield w
    await cancel_and_wait([task], 10)


async def test_a_committed_event_wakes_its_employees_streams_only(
    wakeups: StreamWakeups, pool: AsyncConnectionPool[Conn]
) -> None:
    with wakeups.subscribe("ada") as ada, wakeups.subscribe("bob") as bob:
        async with pool.connection() as conn, conn.transaction():
            await conn.execute(EVENT, ("ada",))
            # Still open: bob's event, committed after it, is heard while ada's is not.
            async with pool.connection() as other, other.transaction():
                await other.execute(EVENT, ("bob",))
            await asyncio.wait_for(bob.wait(), 10)
            assert not ada.is_set()
        await asyncio.wait_for(ada.wait(), 10)
        bob.clear()
        async with pool.connection() as conn, conn.transaction():
            await conn.execute(EVENT, ("carl",))
            await conn.execute(EVENT, ("ada",))
        await asyncio.wait_for(ada.wait(), 10)
        assert not bob.is_set()  # carl's and ada's events woke neither bob
    assert wakeups._waiters == {}  # unsubscribed


async def test_a_lost_listener_polls_meanwhile_and_wakes_every_stream_when_back(
    wakeups: StreamWakeups, pool: AsyncConnectionPool[Conn]
) -> None:
    with wakeups.subscribe("ada") as ada:
        async with pool.connection() as conn:
            await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE query LIKE 'LISTEN%'")  # fmt: skip
            await conn.commit()
        await wait_for(lambda: listening(wakeups, False), timeout=10, what="the listener down")
        ada.clear()
        await wait_for(lambda: listening(wakeups, True), timeout=15, what="the listener back")
        assert ada.is_set()  # what committed meanwhile is read at once
