"""The tier S Temporal dev server: flags, retention, a real workflow, persistence, leftovers."""

from __future__ import annotations

import socket
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    ListTaskQueuePartitionsRequest,
)
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from eventos.local.temporal_dev import BIND_FAILURE, ServerExited, TemporalDevServer

pytestmark = pytest.mark.temporal

NAMESPACE = "eventos-test"


@workflow.defn
class EchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return f"echo: {text}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TemporalDevServer]:
    dev = TemporalDevServer(tmp_path / "temporal", namespace=NAMESPACE)
    yield dev
    dev.stop()


async def run_echo(client: Client, text: str) -> str:
    """Run EchoWorkflow once on a fresh task queue with a real worker; returns its id."""
    queue = f"test-{uuid.uuid4()}"
    workflow_id = f"echo-{uuid.uuid4()}"
    async with Worker(client, task_queue=queue, workflows=[EchoWorkflow]):
        result = await client.execute_workflow(
            EchoWorkflow.run,
            text,
            id=workflow_id,
            task_queue=queue,
            execution_timeout=timedelta(seconds=30),
        )
        partitions = await client.workflow_service.list_task_queue_partitions(
            ListTaskQueuePartitionsRequest(namespace=NAMESPACE, task_queue=TaskQueue(name=queue))
        )
    assert result == f"echo: {text}"
    assert len(partitions.workflow_task_queue_partitions) == 1
    return workflow_id


def test_command_carries_the_tier_s_flags(tmp_path: Path) -> None:
    dev = TemporalDevServer(tmp_path, namespace=NAMESPACE)
    args = dev.command()
    pairs = set(pairwise(args))
    assert args[1:3] == ["server", "start-dev"]
    assert ("--db-filename", str(tmp_path / "temporal.db")) in pairs
    assert ("--sqlite-pragma", "journal_mode=wal") in pairs
    assert ("--sqlite-pragma", "synchronous=NORMAL") in pairs
    assert ("--dynamic-config-value", "matching.enableFairness=true") in pairs
    assert ("--dynamic-config-value", "matching.numTaskqueueReadPartitions=1") in pairs
    assert ("--dynamic-config-value", "matching.numTaskqueueWritePartitions=1") in pairs
    assert ("--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000") in pairs
    assert (
        "--dynamic-config-value",
        "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute=3",
    ) in pairs
    assert ("--ip", "127.0.0.1") in pairs
    assert ("--namespace", NAMESPACE) in pairs
    ports = [dev.port, dev.http_port, dev.metrics_port]
    assert all(ports) and len(set(ports)) == 3
    assert ("--port", str(dev.port)) in pairs
    assert "--headless" in args and "--ui-port" not in args
    assert dev.command() == args  # ports stay put once assigned


def test_command_with_ui_names_its_port(tmp_path: Path) -> None:
    dev = TemporalDevServer(tmp_path, headless=False, ui_port=18233)
    args = dev.command()
    assert ("--ui-port", "18233") in set(pairwise(args)) and "--ui-disable-news-fetch" in args
    assert "--headless" not in args and "--namespace" not in args


def test_the_web_ui_answers_on_loopback_only(tmp_path: Path) -> None:
    """`make run` turns the Web UI on: it answers at `ui_url`, on 127.0.0.1 (the server's own
    address), and nothing listens on the machine's other addresses at its port."""
    from eventos.testing import wait_for_sync  # here: it touches what the sandbox forbids

    dev = TemporalDevServer(tmp_path / "temporal", namespace=NAMESPACE, headless=False)
    try:
        dev.start()
        assert dev.ui_url == f"http://127.0.0.1:{dev.ui_port}"
        answer = wait_for_sync(lambda: _ui_page(dev.ui_url or ""), timeout=30,
                               what="the Web UI answers")  # fmt: skip
        assert "<html" in answer.lower()
        outside = _outside_address()
        if outside is not None:
            with pytest.raises(OSError):
                socket.create_connection((outside, dev.ui_port), timeout=2).close()
    finally:
        dev.stop()
    assert TemporalDevServer(tmp_path / "other").ui_url is None  # headless: none


def _ui_page(url: str) -> str | None:
    import httpx  # here: this module's workflow is sandboxed, and httpx imports urllib

    try:
        r = httpx.get(url, timeout=5, follow_redirects=True)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


def _outside_address() -> str | None:
    """One of this machine's non-loopback IPv4 addresses, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent by a UDP connect
            address: str = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


async def test_serves_workflows_with_7_day_retention_and_keeps_them(
    server: TemporalDevServer,
) -> None:
    server.start()
    client = await Client.connect(server.address, namespace=NAMESPACE)
    described = await client.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=NAMESPACE)
    )
    assert described.config.workflow_execution_retention_ttl.ToTimedelta() == timedelta(days=7)
    workflow_id = await run_echo(client, "hello")

    server.stop()
    assert server.process is not None and server.process.returncode is not None
    assert not server.pid_path.exists()
    with sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)

    server.start()
    client = await Client.connect(server.address, namespace=NAMESPACE)
    earlier = await client.get_workflow_handle(workflow_id).describe()
    assert earlier.status == WorkflowExecutionStatus.COMPLETED
    await run_echo(client, "again")


async def test_a_leftover_server_is_replaced(server: TemporalDevServer) -> None:
    crashed = TemporalDevServer(server.state_dir, namespace=NAMESPACE)
    crashed.start()
    assert crashed.process is not None
    # `crashed` is forgotten without stop(), as if its owner had been killed.

    server.start()
    assert crashed.process.wait(timeout=5) is not None
    assert server.process is not None
    assert server.pid_path.read_text().strip() == str(server.process.pid)
    client = await Client.connect(server.address, namespace=NAMESPACE)
    await run_echo(client, "replaced")


def test_a_start_that_loses_a_port_is_tried_again(tmp_path: Path) -> None:
    """The dev server picks its internal ports itself; one taken between its pick and its bind
    makes it exit. Such a start is tried again, and said, up to its attempts; here the taken port
    is the frontend's, held for the whole test, so every attempt fails the same way."""
    with socket.socket() as holder:
        # Bound, not listening: the server cannot bind it, and a client's connect is refused.
        holder.bind(("127.0.0.1", 0))
        dev = TemporalDevServer(tmp_path, namespace=NAMESPACE, port=holder.getsockname()[1])
        with pytest.raises(ServerExited):
            dev.start(timeout=60, attempts=2)
    assert not dev.running()
    assert dev.log_path.read_bytes().count(BIND_FAILURE) >= 2
