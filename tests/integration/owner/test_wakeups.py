"""Stream wake-ups (LISTEN/NOTIFY): a committed chat event, once placed, wakes its employee's streams, and
only theirs; a listener whose connection dies says so (the streams poll) and comes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn
from eventos.owner import event_positions
from eventos.owner.wakeups import StreamWakeups
from eventos.runtime.service import cancel_and_wait
from eventos.settings import DatabaseSettings
from eventos.testing import wait_for

EVENT = """
INSERT INTO chat_events (employee, session, kind, turn_id, dedupe_key, text)
VALUES (%s, 'owner', 'notice', '', gen_random_uuid()::text, 'hi')
"""


def owned_by(task: asyncio.Task[object], wakeups: StreamWakeups) -> bool:
    frame = getattr(task.get_coro(), "cr_frame", None)
    return frame is not None and frame.f_locals.get("self") is wakeups


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


async def test_a_sequencer_that_missed_its_cancellation_still_stops_with_the_service(
    db_settings: DatabaseSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python 3.11's asyncio.wait_for can swallow a cancellation that races with its inner
    # future: the sequencer's first cancellation is lost here, as it was in CI, where the
    # sequencer went on placing against its test's dropped database.
    placing = asyncio.Event()
    swallowed: list[bool] = []
    real_place = event_positions.place

    async def place(conn: Conn) -> event_positions.Placed:
        if not swallowed:
            placing.set()
            try:
                await asyncio.Event().wait()  # until cancelled
            except asyncio.CancelledError:
                swallowed.append(True)
        return await real_place(conn)

    monkeypatch.setattr(event_positions, "place", place)
    w = StreamWakeups(db_settings)
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(placing.wait(), 10)
    await cancel_and_wait([task], 10)
    assert swallowed and task.done()
    # No loop of these wake-ups is left running (a sequencer that was would place again).
    assert [t for t in asyncio.all_tasks() if not t.done() and owned_by(t, w)] == []
