"""A service whose background loop fails or ends, or that cannot listen on its ports, stops, and
says so with a non-zero exit: a supervisor (the kubelet, `eventos.local`) must see a failure and
restart it, never a clean stop or a service that hangs."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap

import pytest

from eventos.runtime.service import ListenFailed, LoopFailed, Service


async def broken_loop() -> None:
    raise ConnectionError("the database does not answer")


async def short_loop() -> None:
    return None


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


@pytest.mark.parametrize("port", ["grpc_port", "http_port"])
async def test_a_port_taken_stops_the_service_and_closes_what_it_opened(port: str) -> None:
    closed: list[str] = []

    async def close_pool() -> None:
        closed.append("pool")

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        number = taken.getsockname()[1]
        ports = {"grpc_port": 0, port: number}
        service = Service("ingress", on_stop=[close_pool], **ports)  # type: ignore[arg-type]
        with pytest.raises(ListenFailed, match=rf"ingress: cannot listen on 127.0.0.1:{number}"):
            await asyncio.wait_for(service.run(install_signals=False), 30)
    assert closed == ["pool"]


def test_the_process_exits_non_zero_when_a_port_is_taken() -> None:
    program = textwrap.dedent("""
        import socket
        from eventos.runtime.service import Service, run_main

        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        run_main("router", Service("router", grpc_port=taken.getsockname()[1]).run())
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "router: cannot listen on 127.0.0.1" in done.stderr
    assert "Traceback" not in done.stderr
