"""A service whose background loop fails or ends stops, and says so with a non-zero exit: a
supervisor (the kubelet, `eventos.local`) must see a failure and restart it, never a clean stop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from eventos.runtime.service import LoopFailed, Service


async def broken_loop() -> None:
    await asyncio.sleep(0.05)
    raise ConnectionError("the database does not answer")


async def short_loop() -> None:
    await asyncio.sleep(0.05)


async def endless_loop() -> None:
    await asyncio.Event().wait()


async def test_a_failed_loop_stops_the_service_with_its_cause() -> None:
    service = Service("relay", loops=[endless_loop, broken_loop])
    with pytest.raises(LoopFailed, match=r"relay: a loop broken_loop failed: ConnectionError"):
        await asyncio.wait_for(service.run(install_signals=False), 30)


async def test_a_loop_that_ends_on_its_own_is_a_failure_too() -> None:
    service = Service("router", loops=[endless_loop, short_loop])
    with pytest.raises(LoopFailed, match=r"router: a loop short_loop ended"):
        await asyncio.wait_for(service.run(install_signals=False), 30)


async def test_a_requested_stop_is_clean() -> None:
    service = Service("egress", loops=[endless_loop])
    task = asyncio.create_task(service.run(install_signals=False))
    await asyncio.wait_for(service.started(), 30)
    service.stop()
    await asyncio.wait_for(task, 30)  # returns, no LoopFailed


def test_the_process_exits_non_zero_when_a_loop_fails() -> None:
    program = textwrap.dedent("""
        import asyncio
        from eventos.runtime.service import Service, run_main

        async def broken() -> None:
            raise ConnectionError("the database does not answer")

        run_main("relay", Service("relay", loops=[broken]).run())
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "relay: a loop broken failed: ConnectionError" in done.stderr
