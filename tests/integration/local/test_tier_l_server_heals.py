"""`make run TIER=L`'s Temporal server under the instance's supervision: SIGKILLed, it is started
again on its databases and ports, and a workflow of before runs on as the same run. Held (the
hold file `eventosctl restore` writes), it is stopped and stays stopped, even when a restart
would be due; the hold removed, it starts again at once on the same run."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from eventos.fleet.backups import TEMPORAL_HOLD, HeldServer
from eventos.local.servers import SupervisedServer
from eventos.local.temporal_server import TemporalServer
from eventos.settings import ServerTools
from eventos.testing.plugin import (
    TIER_L_MAX_CONNS,
    TIER_L_SHARDS,
    TIER_L_START_S,
    PostgresForTests,
)

pytestmark = [pytest.mark.temporal, pytest.mark.tier_l, pytest.mark.timeout(600)]

LATER_S = 3600.0  # a `now` past any delay of the back-off


async def start_idle(address: str) -> tuple[str, str]:
    """A workflow no worker runs (it stays running): its id and run id."""
    client = await Client.connect(address)
    handle = await client.start_workflow("Idle", id=f"idle-{uuid.uuid4()}", task_queue="idle")
    return handle.id, str(handle.result_run_id)


async def current(address: str, workflow_id: str) -> tuple[WorkflowExecutionStatus | None, str]:
    client = await Client.connect(address)
    found = await client.get_workflow_handle(workflow_id).describe()
    return found.status, found.run_id


def supervise(supervised: SupervisedServer, done: threading.Event) -> None:
    """The instance's supervision loop over one server, until `done`."""
    while not done.wait(0.2):
        supervised.check(time.monotonic())


def test_a_killed_tier_l_server_comes_back_on_its_databases_and_ports(
    postgres_server: PostgresForTests, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    suffix = f"heal_{os.getpid()}"
    server = TemporalServer(
        tmp_path / "temporal-server",
        ServerTools.from_env(root=request.config.rootpath),
        database_url=postgres_server.admin_url,
        shards=TIER_L_SHARDS,
        max_conns=TIER_L_MAX_CONNS,
        database=f"temporal_{suffix}",
        visibility_database=f"temporal_visibility_{suffix}",
    )
    server.start(timeout=TIER_L_START_S)
    said: list[str] = []
    supervised = SupervisedServer("Temporal server", server, said.append)
    try:
        address, ports = server.address, supervised.ports()
        workflow_id, run_id = asyncio.run(start_idle(address))
        assert server.process is not None
        killed = server.process.pid
        os.killpg(killed, signal.SIGKILL)
        server.process.wait(30)

        assert not supervised.check(time.monotonic())
        assert said[0].startswith(f"Temporal server (pid {killed}) was killed by SIGKILL; ")
        assert supervised.check(time.monotonic() + LATER_S), said
        assert said[1] == f"Temporal server restarted (pid {supervised.pid}, restart 1)"
        assert server.address == address and supervised.ports() == ports
        status, run = asyncio.run(current(address, workflow_id))
        assert (status, run) == (WorkflowExecutionStatus.RUNNING, run_id)

        # Held, as a restore holds it: the supervisor (its loop in a thread) stops it.
        supervised.hold = tmp_path / TEMPORAL_HOLD
        assert server.process is not None
        held = HeldServer(supervised.hold, server.process.pid, 60.0)
        done = threading.Event()
        loop = threading.Thread(target=supervise, args=(supervised, done), daemon=True)
        loop.start()
        try:
            asyncio.run(held.stop())
        finally:
            done.set()
            loop.join(30)
        assert not server.running()
        assert said[2] == (f"Temporal server (pid {held.pid}) stopped: held by "
                           f"{supervised.hold} until it is removed")  # fmt: skip
        assert not supervised.check(time.monotonic() + LATER_S)  # held: no start, even when due
        assert not server.running()
        asyncio.run(held.start())
        assert supervised.check(time.monotonic())
        assert said[-1] == f"Temporal server restarted (pid {supervised.pid}, restart 2)", said
        status, run = asyncio.run(current(address, workflow_id))
        assert (status, run) == (WorkflowExecutionStatus.RUNNING, run_id)
    finally:
        server.stop()
        server.drop_databases()
