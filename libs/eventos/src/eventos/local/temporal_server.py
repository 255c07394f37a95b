"""The open-source Temporal server of tier L (SPEC §14), run on this machine as the chart runs it.

`make tools` builds `temporal-server` and `temporal-sql-tool` from the pinned Go module into
`.tools/temporal-server/v<version>` and links them from `.tools/bin` (docs/tier-l.md); the
settings' `ServerTools` names the build to run (EVENTOS_TEMPORAL_SERVER_VERSION: another version
built there, which is how the upgrade tests start an instance on the previous minor).
`TemporalServer` is what `make run TIER=L` and the tier L tests start:

1. the server's configuration is the chart's: `helm template` renders the server ConfigMap with
   the tier L values file, and values overrides fill in this machine's addresses, free ports, the
   database user and the shard count (fixed when the databases are created: 64 by default, a
   test instance takes fewer);
2. the `temporal` and `temporal_visibility` databases are created on the instance's PostgreSQL
   and their schemas set up and updated to the pinned version with `temporal-sql-tool`, the steps
   of the chart's schema Job;
3. the server runs with all four services in one process, as the chart's Deployment runs it;
4. the namespace is registered with a 7-day retention, as the chart's namespace Job does.

State (the rendered config, the log, the pid file) lives under the state directory; the databases
are on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    DescribeTaskQueueRequest,
    RegisterNamespaceRequest,
)
from temporalio.client import Client
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode

from eventos.errors import EventOSError
from eventos.fleet.temporal_sql import SQL_TOOL, SqlLogin, sql_tool, update_schema
from eventos.local import processes
from eventos.local.ports import free_port
from eventos.local.temporal_dev import RETENTION, retention_of, run_in_thread, set_retention
from eventos.settings import ServerTools

log = logging.getLogger(__name__)

SERVER = "temporal-server"
HELM = "helm"
CONFIGMAP = "templates/temporal-server-configmap.yaml"
TIER_L_VALUES = "values-tier-l.yaml"
# What the chart's required values need to render; none of it reaches the server's config.
PLACEHOLDERS = {
    "instance.id": "local",
    "secrets.database.existingSecret": "local",
    "secrets.admin.existingSecret": "local",
    "secrets.outbox.existingSecret": "local",
    "temporal.server.sql.existingSecret": "local",
}
INTERNAL_PORTS = (
    "frontendMembership",
    "history",
    "historyMembership",
    "matching",
    "matchingMembership",
    "worker",
    "workerMembership",
)
TOOL_TIMEOUT_S = 120.0
READY_QUEUE = "eventos-readiness"
_POLL_INTERVAL = 0.2


class ServerError(EventOSError):
    """The tier L Temporal server could not be prepared or started."""


@dataclass
class TemporalServer:
    """One `temporal-server start` on the chart's configuration, as a child process."""

    state_dir: Path
    tools: ServerTools
    database_url: str = field(repr=False)
    namespace: str = "default"
    shards: int = 64
    max_conns: int = 0  # 0: the chart's tier L value
    database: str = "temporal"
    visibility_database: str = "temporal_visibility"
    host: str = "127.0.0.1"
    port: int = 0
    http_port: int = 0
    metrics_port: int = 0
    internal_ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    version: str = ""  # the version the server was last started on

    def __post_init__(self) -> None:
        self.state_dir = self.state_dir.absolute()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_dir(self) -> Path:
        return self.state_dir / "config"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "temporal-server.log"

    @property
    def pid_path(self) -> Path:
        return self.state_dir / "temporal-server.pid"

    @property
    def login(self) -> SqlLogin:
        return SqlLogin.of_url(self.database_url)

    def binary_version(self) -> str:
        """The version of the server binary the settings name (its `--version`)."""
        binary = self.tools.temporal_binary(SERVER)
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
        return done.stdout.split()[-1] if done.returncode == 0 and done.stdout.split() else ""

    def assign_ports(self) -> None:
        """Give every port still 0 a distinct free one."""
        taken = {self.port, self.http_port, self.metrics_port, *self.internal_ports.values()}

        def pick() -> int:
            port = free_port(self.host, taken)
            taken.add(port)
            return port

        self.port = self.port or pick()
        self.http_port = self.http_port or pick()
        self.metrics_port = self.metrics_port or pick()
        for name in INTERNAL_PORTS:
            self.internal_ports[name] = self.internal_ports.get(name) or pick()

    # -- the chart's configuration -------------------------------------------------------

    def overrides(self) -> dict[str, str | int]:
        """The values that place the chart's server on this machine."""
        login = self.login
        values: dict[str, str | int] = {
            **PLACEHOLDERS,
            "tier": "L",
            "temporal.ports.grpc": self.port,
            "temporal.ports.http": self.http_port,
            "temporal.ports.metrics": self.metrics_port,
            "temporal.server.bindOnIP": self.host,
            "temporal.server.configDir": str(self.config_dir),
            "temporal.server.numHistoryShards": self.shards,
            "temporal.server.logLevel": "warn",
            "temporal.server.sql.host": login.host,
            "temporal.server.sql.port": login.port,
            "temporal.server.sql.user": login.user,
            "temporal.server.sql.database": self.database,
            "temporal.server.sql.visibilityDatabase": self.visibility_database,
        }
        if self.max_conns:
            values["temporal.server.sql.maxConns"] = self.max_conns
        for name, port in self.internal_ports.items():
            values[f"temporal.server.internalPorts.{name}"] = port
        return values

    def render_config(self) -> dict[str, str]:
        """The chart's server ConfigMap (`helm template`), its files by name."""
        args = [str(self.tools.binary(HELM)), "template", "eventos", str(self.tools.chart)]
        args += ["-f", str(self.tools.chart / TIER_L_VALUES), "--show-only", CONFIGMAP]
        for key, value in self.overrides().items():
            # Numbers with --set (the values schema wants integers), text with --set-string.
            flag = "--set" if isinstance(value, int) else "--set-string"
            args += [flag, f"{key}={value}"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        if done.returncode != 0:
            raise ServerError(f"helm template of the server ConfigMap failed:\n{done.stderr}")
        doc: dict[str, Any] = yaml.safe_load(done.stdout)
        data: dict[str, str] = doc["data"]
        return data

    def write_config(self) -> None:
        self.config_dir.mkdir(parents=True, exist_ok=True)
        for name, text in self.render_config().items():
            (self.config_dir / name).write_text(text)

    # -- the databases (the chart's schema Job) ------------------------------------------

    def _sql_tool(self, database: str, *command: str) -> None:
        sql_tool(self.tools.temporal_binary(SQL_TOOL), self.login, database, *command)

    def _database_exists(self, database: str) -> bool:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
            return found.fetchone() is not None

    def prepare_databases(self) -> None:
        """Create both databases where missing, set up and update their schemas to the
        version of the build it runs (a no-op on databases already there)."""
        for database in (self.database, self.visibility_database):
            if not self._database_exists(database):
                self._sql_tool(database, "create-database")
                # The version table on a new database; the tool refuses a database set up before.
                self._sql_tool(database, "setup-schema", "-v", "0.0")
        kinds = {"main": self.database, "visibility": self.visibility_database}
        update_schema(self.tools.temporal_build(), self.login, kinds)

    def drop_databases(self) -> None:
        """Drop both databases (the server must be stopped)."""
        for database in (self.database, self.visibility_database):
            if self._database_exists(database):
                self._sql_tool(database, "drop-database", "--force")

    # -- the process ---------------------------------------------------------------------

    def command(self) -> list[str]:
        """The chart Deployment's command, with the state directory as the config root."""
        root, config = self.config_dir.parent, self.config_dir.name
        args = [str(self.tools.temporal_binary(SERVER)), "--root", str(root), "--config", config]
        return [*args, "--env", "server", "--allow-no-auth", "start"]

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop_leftover(self, timeout: float = 15.0) -> None:
        """Stop a server a crashed run left on this state directory."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return
        command = processes.cmdline(pid) if processes.pid_alive(pid) else ""
        if SERVER in command and str(self.config_dir.parent) in command:
            log.warning("stopping a leftover Temporal server (pid %d) on %s", pid, self.state_dir)
            os.kill(pid, signal.SIGTERM)
            if processes.wait_gone([pid], timeout):
                os.kill(pid, signal.SIGKILL)
                processes.wait_gone([pid], timeout)
        self.pid_path.unlink(missing_ok=True)

    def start(self, timeout: float = 90.0) -> None:
        """Render the config, prepare the databases, start the server; return once the
        namespace answers with a 7-day retention."""
        if self.running():
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.stop_leftover()
        self.assign_ports()
        self.write_config()
        self.version = self.binary_version()
        self.prepare_databases()
        # What the chart's Deployment gives the container, and nothing of ours: the two
        # variables its config reads.
        env = {
            "TEMPORAL_SQL_PASSWORD": self.login.password,
            "POD_IP": self.host,  # the membership ring's broadcast address (the pod's IP)
        }
        args = self.command()
        with self.log_path.open("ab") as logfile:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.pid_path.write_text(f"{self.process.pid}\n")
        try:
            self.ensure_namespace(self.namespace, timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def ensure_namespace(self, namespace: str, timeout: float = 60.0) -> None:
        """Register `namespace` with a 7-day retention unless it exists with it; return once
        the frontend serves calls in it."""
        run_in_thread(self._until_ready(namespace, timeout))

    async def _until_ready(self, namespace: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        client: Client | None = None
        error: Exception | None = None
        while True:
            if not self.running():
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise ServerError(f"the Temporal server exited; last of {self.log_path}:\n{tail}")
            try:
                client = client or await Client.connect(self.address, namespace=namespace)
                if await _namespace_ready(client, namespace):
                    return
            except (RuntimeError, TemporalError) as exc:
                error = exc
            if time.monotonic() > deadline:
                raise ServerError(
                    f"the Temporal server had no namespace {namespace!r} after {seconds}s; "
                    f"see {self.log_path}"
                ) from error
            await asyncio.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds."""
        processes.stop_child(self.process, self.pid_path, timeout)


async def _namespace_ready(client: Client, namespace: str) -> bool:
    """One step towards the namespace registered, at 7 days, and served: True once it is."""
    service = client.workflow_service
    try:
        await service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        request = RegisterNamespaceRequest(namespace=namespace)
        request.workflow_execution_retention_period.FromTimedelta(RETENTION)
        await service.register_namespace(request)
        return False
    if await retention_of(client, namespace) != RETENTION:
        await set_retention(client, namespace, RETENTION)
        return False
    # Registered is not yet served: the frontend's namespace cache must know it too.
    probe = DescribeTaskQueueRequest(namespace=namespace, task_queue=TaskQueue(name=READY_QUEUE))
    await service.describe_task_queue(probe)
    return True
