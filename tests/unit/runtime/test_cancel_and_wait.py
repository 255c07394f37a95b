"""Stopping loops: a task that swallowed a cancellation is cancelled again (eventos.runtime.service)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from eventos.runtime.service import cancel_and_wait


async def swallows_once() -> None:
    # What Python 3.11's wait_for can do when its inner future finishes meanwhile:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(60)
    await asyncio.sleep(60)


async def test_a_task_that_swallowed_one_cancellation_still_stops() -> None:
    task = asyncio.create_task(swallows_once())
    await asyncio.sleep(0)
    await cancel_and_wait([task], grace_s=5)
    assert task.cancelled()


async def test_a_task_that_never_stops_is_left_and_named(caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(60)

    task = asyncio.create_task(stubborn(), name="stubborn-loop")
    await asyncio.sleep(0)
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
    inner = asyncio.create_task(swallows_once())
    await asyncio.sleep(0)
    outer = asyncio.create_task(cancel_and_wait([inner], grace_s=5))
    await asyncio.sleep(0)
    outer.cancel()
    await asyncio.wait([outer])
    assert outer.cancelled()
    assert inner.cancelled()  # stopped before its caller ended
