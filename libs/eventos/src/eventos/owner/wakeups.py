"""Wake-ups from PostgreSQL (LISTEN/NOTIFY, SPEC §4) and the sequencer of the event streams.

A committed chat or operator event notifies; the sequencer (`eventos.owner.event_positions`) then
places it, and the streams reading what was placed wake at once instead of on their next poll:
a chat event's employee's chat streams, every operator stream. The sequencer's own commit
notifies `eventos_events_placed`, which wakes the streams of every ingress process.

A notification is only a hint: the database stays the truth, and a stream always reads its
rows after a wake. One listening connection and one placing connection per process
(`StreamWakeups.run`); the placer also runs every few seconds by itself, and every 250 ms while
the listener is down (the database restarts, the connection drops), when the streams poll
too; every stream is woken when the listener is back, so nothing committed meanwhile waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from eventos.db import connect
from eventos.db.sql import Q
from eventos.owner import event_positions
from eventos.runtime.service import cancel_and_wait
from eventos.settings import DatabaseSettings

log = logging.getLogger(__name__)

RECONNECT_S = 2.0
PLACE_POLL_S = 0.25  # while nobody listens
PLACE_RECHECK_S = 5.0  # while the listener hears every commit (its notifications are hints)
OPERATOR = "(operator)"  # the operator streams' topic; no employee name holds a parenthesis
PLACED = "eventos_events_placed"
STOP_S = 5.0  # a stopping service waits this long for the listener and the sequencer


class StreamWakeups:
    """The event streams open in this process, by topic (an employee's chat streams, or
    OPERATOR), the listener that wakes them and the sequencer that places their events."""

    def __init__(self, settings: DatabaseSettings) -> None:
        self.settings = settings
        self.listening = False
        self.closed = False  # the service is stopping: streams end
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._due = asyncio.Event()  # events may wait for a place

    @contextlib.contextmanager
    def subscribe(self, topic: str) -> Iterator[asyncio.Event]:
        """An event set whenever events of `topic` may have been placed (an employee's chat
        events, or OPERATOR); the caller clears it before each read."""
        woken = asyncio.Event()
        self._waiters.setdefault(topic, set()).add(woken)
        try:
            yield woken
        finally:
            waiters = self._waiters.get(topic, set())
            waiters.discard(woken)
            if not waiters:
                self._waiters.pop(topic, None)

    def wake(self, topic: str | None = None) -> None:
        """Wake the streams of `topic`, or every stream."""
        groups = self._waiters.values() if topic is None else [self._waiters.get(topic, ())]
        for waiters in groups:
            for woken in waiters:
                woken.set()

    async def run(self) -> None:
        """Listen and place until cancelled (the service stops: then every stream ends, and
        its client reconnects elsewhere or later); each reconnects while the database is
        away."""
        loops = [asyncio.create_task(self._listen()), asyncio.create_task(self._place())]
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # neither ends on its own: a loop that did raises here
        finally:
            # A loop ends at its next turn once closed, and is cancelled again until it ends:
            # a TaskGroup cancels its tasks only once, and a sequencer whose cancellation 3.11's
            # `asyncio.wait_for` swallowed went on placing (against a dropped database) long
            # after its service stopped.
            self.closed = True
            self._due.set()
            self.wake()
            await cancel_and_wait(loops, STOP_S)

    def _heard(self, channel: str, payload: str) -> None:
        if channel != PLACED:
            self._due.set()  # committed, not placed yet
        elif payload == "operator":
            self.wake(OPERATOR)
        else:
            self.wake(payload.removeprefix("chat:"))

    async def _listen(self) -> None:
        while not self.closed:
            try:
                conn = await connect(self.settings, autocommit=True)
                async with conn:
                    await conn.execute(Q["events_listen"])
                    self.listening = True
                    self._due.set()  # what committed while nobody listened
                    self.wake()
                    async for note in conn.notifies():
                        self._heard(note.channel, note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database went away, or refused us
                log.warning("stream wake-ups stopped (%s); polling until they are back", exc)
            finally:
                self.listening = False
            await asyncio.sleep(RECONNECT_S)

    async def _place(self) -> None:
        while not self.closed:
            try:
                conn = await connect(self.settings)
                async with conn:
                    while not self.closed:
                        self._due.clear()  # before the run: a commit during it runs it again
                        placed = await event_positions.place(conn)
                        if placed.operator:
                            self.wake(OPERATOR)
                        for employee in placed.chat_employees:
                            self.wake(employee)
                        wait = PLACE_RECHECK_S if self.listening else PLACE_POLL_S
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._due.wait(), wait)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("the event sequencer stopped (%s); again in %gs", exc, RECONNECT_S)
            if not self.closed:
                await asyncio.sleep(RECONNECT_S)
