"""A worker after a Temporal outage (eventos.runtime.temporal.until_outage_ends): once the
server answers again the running workers are shut down, so the caller's new ones poll at once
instead of waiting out the SDK's task-poll backoff (up to 10 s per queue)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from eventos.local.temporal_dev import TemporalDevServer
from eventos.runtime import temporal as runtime_temporal
from eventos.runtime.temporal import until_outage_ends
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal


@workflow.defn(sandboxed=False)  # the test module imports what the sandbox refuses
class PingWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return f"pong: {text}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TemporalDevServer]:
    dev = TemporalDevServer(tmp_path / "temporal")
    dev.start()
    try:
        yield dev
    finally:
        dev.stop()


async def watched_worker(
    server: TemporalDevServer, prefix: str
) -> tuple[Client, str, asyncio.Future[None]]:
    """A client, a queue of the test's own, and a worker polling it under the watch."""
    client = await Client.connect(server.address, namespace=server.namespace)
    queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    worker = Worker(client, task_queue=queue, workflows=[PingWorkflow])
    return client, queue, asyncio.ensure_future(until_outage_ends(client, [worker], worker.run()))


async def test_workers_end_when_an_outage_ends_and_a_new_one_polls_at_once(
    server: TemporalDevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_temporal, "OUTAGE_PROBE_S", 0.2)
    client, queue, watched = await watched_worker(server, "outage")
    assert await ping(client, queue, "before") == "pong: before"  # the worker runs
    await asyncio.to_thread(server.stop)
    refused = 0

    async def refused_enough() -> bool:
        nonlocal refused
        try:
            await client.service_client.check_health(timeout=timedelta(seconds=1))
        except RPCError:
            refused += 1
        return refused > runtime_temporal.OUTAGE_AFTER_REFUSALS + 1

    # Checked at the watch's own pace: as many refusals in a row as it needs, and more.
    await wait_for(refused_enough, timeout=30, interval=runtime_temporal.OUTAGE_PROBE_S,
                   what="Temporal refusing")  # fmt: skip
    assert not watched.done()  # an outage alone ends nothing
    await asyncio.to_thread(server.start)  # the same SQLite file and ports
    await wait_for(lambda: _done(watched), timeout=30, what="the worker shut down")
    assert watched.exception() is None

    fresh = Worker(client, task_queue=queue, workflows=[PingWorkflow])
    async with fresh:
        assert await ping(client, queue, "again") == "pong: again"


async def test_a_slow_or_healthy_server_never_restarts_the_worker(
    server: TemporalDevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_temporal, "OUTAGE_PROBE_S", 0.05)
    client, queue, watched = await watched_worker(server, "healthy")
    said = await ping(client, queue, "x")
    assert said == "pong: x" and not watched.done()  # many probes answered: still running
    watched.cancel()
    await asyncio.gather(watched, return_exceptions=True)


async def ping(client: Client, queue: str, text: str) -> str:
    """Run PingWorkflow on `queue` to its end: its answer."""
    return await client.execute_workflow(
        PingWorkflow.run, text, id=f"ping-{uuid.uuid4().hex[:8]}", task_queue=queue
    )


async def _done(task: asyncio.Future[None]) -> bool:
    return task.done()
