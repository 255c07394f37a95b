"""Stopping loops: a task that swallowed a cancellation is cancelled again (eventos.runtime.service)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import pytest

from eventos.runtime.service import cancel_and_wait


@dataclass
class SwallowsOnce:
    """A loop that swallows its first cancellation, as Python 3.11's wait_for can when its inner
    future finishes meanwhile; it waits on events no one sets (never on a clock)."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    swallowed: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        self.started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        self.swallowed.set()
        await asyncio.Event().wait()


async def test_a_task_that_swallowed_one_cancellation_still_stops() -> None:
    loop = SwallowsOnce()
    task = asyncio.create_task(loop.run())
    await loop.started.wait()
    await cancel_and_wait([task], grace_s=5)
    assert loop.swallowed.is_set() and task.cancelled()


async def test_a_task_that_never_stops_is_left_and_named(caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def stubborn() -> None:
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    task = asyncio.create_task(stubborn(), name="stubborn-loop")
    await started.wait()
    await cancel_and_wait([task], grace_s=1)
    assert not task.done()
    assert "1 task(s) did not stop within 1 s: stubborn-loop" in caplog.text
    release.set()
    task.cancel()
    await asyncio.wait([task])
    assert task.done()


async def test_a_caller_cancelled_meanwhile_still_stops_its_tasks_first() -> None:
    # A loop that stops loops of its own (the stream wake-ups' listener and sequencer) is
    # cancelled again by its service while it waits for them: it still waits, then ends.
    loop = SwallowsOnce()
    inner = asyncio.create_task(loop.run())
    await loop.started.wait()
    outer = asyncio.create_task(cancel_and_wait([inner], grace_s=5))
    await loop.swallowed.wait()  # the caller cancelled it once and waits for it
    outer.cancel()
    await asyncio.wait([outer])
    assert outer.cancelled()
    assert inner.cancelled()  # stopped before its caller ended
