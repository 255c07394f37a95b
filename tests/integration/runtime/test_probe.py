"""`python -m eventos.runtime.probe` (what the chart's `helm test` runs) against real services:
ready only when /readyz answers 200 and gRPC health says SERVING; any other answer fails it."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from eventos.local.ports import free_port
from eventos.runtime.service import Service


async def not_ready() -> None:
    raise ConnectionError("the database does not answer")


async def always_ready() -> None:
    return None


@pytest.fixture
async def services() -> AsyncIterator[tuple[Service, Service]]:
    ready = Service("router", http_port=0, grpc_port=0, checks={"db": always_ready})
    sick = Service("relay", http_port=0, grpc_port=0, checks={"db": not_ready})
    tasks = [asyncio.create_task(s.run(install_signals=False)) for s in (ready, sick)]
    await asyncio.wait_for(asyncio.gather(ready.started(), sick.started()), 30)
    yield ready, sick
    for s in (ready, sick):
        s.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)


async def probe(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "eventos.runtime.probe", "--timeout", "10", "--wait", "3", *args]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True,
                                   timeout=120, check=False)  # fmt: skip


async def test_ready_services_pass(services: tuple[Service, Service]) -> None:
    ready, _ = services
    done = await probe("--http", f"router=http://127.0.0.1:{ready.bound_http_port}",
                       "--grpc", f"router=127.0.0.1:{ready.bound_grpc_port}")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 of 2 ready" in done.stdout
    assert "SERVING" in done.stdout


async def test_a_service_not_ready_fails_with_its_reason(
    services: tuple[Service, Service],
) -> None:
    ready, sick = services
    done = await probe("--http", f"router=http://127.0.0.1:{ready.bound_http_port}",
                       "--http", f"relay=http://127.0.0.1:{sick.bound_http_port}")  # fmt: skip
    assert done.returncode == 1
    line = next(x for x in done.stdout.splitlines() if "relay" in x)
    assert line.startswith("NOT READY") and " 503 " in line and "db" in line
    assert "1 of 2 ready" in done.stdout


async def test_nothing_listening_fails() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = s.getsockname()[1]
        done = await probe("--http", f"egress=http://127.0.0.1:{port}",
                           "--grpc", f"egress=127.0.0.1:{port}")  # fmt: skip
    assert done.returncode == 1
    assert "0 of 2 ready" in done.stdout
    assert "unreachable" in done.stdout and "UNAVAILABLE" in done.stdout


async def test_no_target_is_a_usage_error() -> None:
    done = await probe()
    assert done.returncode == 2
    assert "at least one" in done.stderr


async def test_a_target_ready_a_moment_later_passes() -> None:
    late = Service("egress", http_port=0, checks={"db": always_ready})
    with socket.socket() as s:
        # SO_REUSEADDR, as the service's own socket has it: the connection accepted here
        # inherits it, and while that connection closes (FIN_WAIT until the probe closes its
        # end) the service may bind the port. Without it the bind fails "Address already in
        # use" whenever the probe is slow to close (a loaded machine).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", free_port()))  # reserved, below the ephemeral range
        s.listen()
        s.setblocking(False)
        port = s.getsockname()[1]
        running = asyncio.create_task(
            probe("--wait", "60", "--http", f"egress=http://127.0.0.1:{port}")
        )
        # The scenario: the probe's first attempt fails (accepted, then closed unanswered);
        # only then does the service listen on the port.
        first, _ = await asyncio.wait_for(asyncio.get_running_loop().sock_accept(s), 60)
        first.close()
    late.http_port = port
    task = asyncio.create_task(late.run(install_signals=False))
    try:
        done = await asyncio.wait_for(running, 120)
    finally:
        late.stop()
        await asyncio.wait_for(task, 30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 of 1 ready" in done.stdout
