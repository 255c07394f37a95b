"""Wake-ups from PostgreSQL (LISTEN/NOTIFY, SPEC §4): a committed chat event wakes the event
streams of its employee at once instead of on their next poll.

A notification is only a hint: the database stays the truth, and a stream always reads its
rows after a wake. One listening connection per process (`ChatWakeups.run`); while it is down
(the database restarts, the connection drops) the streams poll every 250 ms as before, and
every stream is woken when it is back, so nothing committed meanwhile waits for a poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from eventos.db import connect
from eventos.db.sql import Q
from eventos.settings import DatabaseSettings

log = logging.getLogger(__name__)

RECONNECT_S = 2.0


class ChatWakeups:
    """The event streams open in this process, by employee, and the listener that wakes them."""

    def __init__(self, settings: DatabaseSettings) -> None:
        self.settings = settings
        self.listening = False
        self._waiters: dict[str, set[asyncio.Event]] = {}

    @contextlib.contextmanager
    def subscribe(self, employee: str) -> Iterator[asyncio.Event]:
        """An event set whenever `employee` may have new chat events (the caller clears it
        before each read)."""
        woken = asyncio.Event()
        self._waiters.setdefault(employee, set()).add(woken)
        try:
            yield woken
        finally:
            waiters = self._waiters.get(employee, set())
            waiters.discard(woken)
            if not waiters:
                self._waiters.pop(employee, None)

    def wake(self, employee: str | None = None) -> None:
        """Wake the streams of `employee`, or every stream."""
        groups = self._waiters.values() if employee is None else [self._waiters.get(employee, ())]
        for waiters in groups:
            for woken in waiters:
                woken.set()

    async def run(self) -> None:
        """Listen until cancelled; reconnect while the database is unavailable."""
        while True:
            try:
                conn = await connect(self.settings, autocommit=True)
                async with conn:
                    await conn.execute(Q["chat_events_listen"])
                    self.listening = True
                    self.wake()  # what committed while nobody listened
                    async for note in conn.notifies():
                        self.wake(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database went away, or refused us
                log.warning("chat wake-ups stopped (%s); polling until they are back", exc)
            finally:
                self.listening = False
            await asyncio.sleep(RECONNECT_S)
