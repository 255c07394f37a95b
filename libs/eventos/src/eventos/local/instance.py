"""`make run`: a local instance on one machine (SPEC §17 Local instance).

Embedded PostgreSQL (unless EVENTOS_DATABASE_URL is set), the Temporal dev server with the
tier S flags (unless TEMPORAL_ADDRESS is set), migrations, and the six services as child
processes, each in its own process group and health-checked on /readyz before the instance
says "ready"; while it runs, any of these processes that exits is started again on its state
and ports (eventos.local.servers, eventos.local.restarts). At tier L (`make run TIER=L`,
docs/tier-l.md) the Temporal server is the open-source one built by `make tools`, on the
chart's configuration and databases `temporal` and `temporal_visibility` of the instance's
PostgreSQL, and the LLM workers are one process per class (`LLM_CLASS=c1` … `c4`), as the
chart deploys them. State lives under `.eventos/` of
the working directory: `stack.json` (every address, written once ready, removed on a clean
stop), `pids.json` (what a later run stops after a crash), `admin-token`, `internal-token`,
`outbox-keys`, `logs/`, `pg/`, `temporal/`,
`spool/` (webhook bodies while they arrive), `secrets/`, and at tier L `temporal-server/`.

`LocalStack` is the programmatic form the tests use; `python -m eventos.local` wraps it
with signal handling, a summary and one command to try.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from eventos import names
from eventos.db import connect
from eventos.db.migrate import Migration, migrate
from eventos.errors import EventOSError
from eventos.fleet.releases import LocalRelease, TemporalPin, read_request
from eventos.local.embedded_pg import EmbeddedPostgres
from eventos.local.examples import EXAMPLE_OPERATOR_ENV, ExampleOutcome, apply_examples
from eventos.local.ports import RESERVED_S, free_port, renew
from eventos.local.processes import LockHeld, PidLock, Recorded, stop_groups
from eventos.local.restarts import exit_text
from eventos.local.servers import SupervisedServer
from eventos.local.service_process import HOST, ServiceProcess
from eventos.local.temporal_dev import TemporalDevServer
from eventos.local.temporal_server import TemporalServer
from eventos.outbox.keys import FILE_VAR as OUTBOX_KEYS_FILE_VAR
from eventos.outbox.keys import VAR as OUTBOX_KEYS_VAR
from eventos.outbox.keys import new_key_entry
from eventos.runtime.service import READYZ_PROBE_TIMEOUT_S
from eventos.settings import DatabaseSettings, SecretStore, ServerTools
from eventos.telemetry.redact import protect_logs
from eventos.telemetry.settings import LOG_EXCEPTION_TEXT, LOG_EXCEPTIONS_VAR

STATE_DIR = ".eventos"
DATABASE = "eventos"
GRPC_SERVICES = frozenset({"ingress", "router", "relay"})
# Who kicks whom after a commit (SPEC §4): ingress → router → relay.
KICKS = {"ingress": "router", "router": "relay"}
TIERS = ("S", "L")
LLM_CLASSES = ("c1", "c2", "c3", "c4")  # tier L: one workers-llm process per class queue
READY_POLL_S = 0.1
SUPERVISE_POLL_S = 0.5
# Every process restarts on its ports: the instance keeps them reserved (eventos.local.ports)
# for as long as it runs, renewing well before a reservation would age out.
PORTS_RENEW_S = RESERVED_S / 4


class StackError(EventOSError):
    """The local instance could not start."""


class StopRequested(EventOSError):
    """A stop was requested while the local instance was starting."""


def _write_private(path: Path, text: str) -> None:
    """Replace `path` atomically with an owner-only file (it may hold the admin token)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def _print(line: str) -> None:
    print(line, flush=True)


@dataclass
class LocalStack:
    """One local instance whose state lives in `root/.eventos`."""

    root: Path
    examples_dir: Path | None = None
    tier: str = "S"
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    say: Callable[[str], None] = _print
    database_url: str = ""
    temporal_address: str = ""
    temporal_namespace: str = "default"
    admin_token: str = field(default="", repr=False)
    internal_token: str = field(default="", repr=False)
    outbox_keys_file: Path | None = None
    services: dict[str, ServiceProcess] = field(default_factory=dict)
    employees: list[ExampleOutcome] = field(default_factory=list)
    postgres: EmbeddedPostgres | None = None
    temporal: TemporalDevServer | TemporalServer | None = None
    # Start PostgreSQL and Temporal again when they exit (a fault harness that stops and starts
    # them itself, for outages of a chosen length, turns this off).
    heal_servers: bool = True
    servers: list[SupervisedServer] = field(default_factory=list)
    # The release request applied last (eventos.local.releases): its serial and release.
    release_serial: int = 0
    release: LocalRelease | None = None
    _lock: PidLock = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event)
    _renew_at: float = field(default_factory=lambda: time.monotonic() + PORTS_RENEW_S)

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise StackError(f"the tier is S or L, not {self.tier!r}")
        self.root = self.root.absolute()
        self._lock = PidLock(self.state_dir / "lock")

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def admin_token_file(self) -> Path | None:
        """The admin token's file, which ingress and eventosctl re-read when it is rewritten (a
        rotation, docs/security.md); None when EVENTOS_ADMIN_TOKEN gives the token."""
        return None if self.env.get("EVENTOS_ADMIN_TOKEN") else self.state_dir / "admin-token"

    @property
    def stack_file(self) -> Path:
        return self.state_dir / "stack.json"

    @property
    def pids_file(self) -> Path:
        return self.state_dir / "pids.json"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def secrets_dir(self) -> Path:
        given = self.env.get("EVENTOS_SECRETS_DIR")
        return Path(given) if given else self.state_dir / "secrets"

    @property
    def ingress_url(self) -> str:
        return self.services["ingress"].http_url

    def request_stop(self) -> None:
        """Ask a starting or running instance to stop (what SIGINT and SIGTERM do)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise StopRequested()

    # -- start ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start everything, wait for readiness, write stack.json, apply the examples."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except LockHeld as exc:
            raise StackError(
                f"another local instance (pid {exc.owner}) runs on {self.state_dir}; "
                "stop it first (Ctrl-C in its terminal)"
            ) from None
        self.stack_file.unlink(missing_ok=True)
        try:
            self._stop_leftovers()
            for step in (self._start_database, self._migrate, self._start_temporal):
                self._check_stop()
                step()
            self.admin_token = self._token("EVENTOS_ADMIN_TOKEN", "admin-token")
            self.internal_token = self._token("EVENTOS_INTERNAL_TOKEN", "internal-token")
            self.outbox_keys_file = self._outbox_keys()
            self._check_stop()
            self._spawn_services()
            self._wait_ready()
            self._write_stack()
            self._check_stop()
            self._apply_examples()
        except BaseException:
            self.stop()
            raise

    def _stop_leftovers(self) -> None:
        """Stop services a crashed run left behind (PostgreSQL and Temporal do their own)."""
        try:
            doc = json.loads(self.pids_file.read_text())
            recorded = [Recorded.from_json(r) for r in doc.get("services", {}).values()]
        except (OSError, ValueError, KeyError, TypeError):
            recorded = []
        leftovers = [r.pid for r in recorded if r.still_ours()]
        if leftovers:
            self.say(f"stopping {len(leftovers)} service(s) left by a previous run: {leftovers}")
            stop_groups(leftovers, self.stop_timeout_s)
        self.pids_file.unlink(missing_ok=True)

    def _start_database(self) -> None:
        given = self.env.get("EVENTOS_DATABASE_URL")
        if given:
            self.say("PostgreSQL: using EVENTOS_DATABASE_URL")
            self.database_url = given
            return
        self.say(f"starting PostgreSQL (embedded, data in {STATE_DIR}/pg) …")
        self.postgres = EmbeddedPostgres(self.state_dir / "pg", durable=True)
        self.postgres.start()
        self.servers.append(SupervisedServer("PostgreSQL", self.postgres, self.say))
        self.database_url = self.postgres.ensure_database(DATABASE)
        self._link_log("postgres", self.postgres.log_path)

    def _migrate(self) -> None:
        async def run() -> list[Migration]:
            conn = await connect(DatabaseSettings(url=self.database_url))
            async with conn:
                return await migrate(conn)

        applied = asyncio.run(run())
        done = ", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "none (up to date)"
        self.say(f"migrations applied: {done}")

    def _start_temporal(self) -> None:
        self.temporal_namespace = self.env.get("TEMPORAL_NAMESPACE", "default")
        given = self.env.get("TEMPORAL_ADDRESS")
        if given:
            self.say(f"Temporal: using TEMPORAL_ADDRESS {given}")
            self.temporal_address = given
            return
        if self.tier == "L":
            self.temporal = self._tier_l_server()
        else:
            self.say(f"starting the Temporal dev server (state in {STATE_DIR}/temporal) …")
            self.temporal = TemporalDevServer(
                self.state_dir / "temporal", namespace=self.temporal_namespace, headless=False
            )
        self.temporal.start()
        label = "Temporal server" if self.tier == "L" else "Temporal dev server"
        self.servers.append(SupervisedServer(label, self.temporal, self.say))
        self.temporal_address = self.temporal.address
        self._link_log("temporal", self.temporal.log_path)

    def _tier_l_server(self) -> TemporalServer:
        """The chart's tier L server on the instance's PostgreSQL (64 shards, the chart's), on
        the build the settings name, or the one the last release request named (an upgrade's)."""
        admin_url = self.postgres.url() if self.postgres is not None else self.database_url
        tools = ServerTools.from_env(self.env, self.root)
        request = read_request(self.state_dir)
        pin = request.temporal if request is not None else None
        if pin is not None and Path(pin.build).is_dir():
            tools = _on_build(tools, pin)
        server = TemporalServer(
            self.state_dir / "temporal-server",
            tools,
            database_url=admin_url,
            namespace=self.temporal_namespace,
        )
        self.say(
            f"starting the Temporal server (tier L, {server.shards} history shards, the chart's "
            f"config; databases {server.database} and {server.visibility_database}; build "
            f"{tools.temporal_build()}) …"
        )
        return server

    def _link_log(self, name: str, target: Path) -> None:
        """Every log under logs/, even those PostgreSQL and Temporal keep in their folders."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        link = self.logs_dir / f"{name}.log"
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(os.path.relpath(target, self.logs_dir))

    def _token(self, variable: str, filename: str) -> str:
        """The token `variable` if set, else the one generated on the first run."""
        given = self.env.get(variable)
        if given:
            return given
        path = self.state_dir / filename
        if path.exists():
            return path.read_text().strip()
        token = secrets.token_urlsafe(32)
        _write_private(path, token + "\n")
        return token

    def _outbox_keys(self) -> Path | None:
        """The file of keys sealing outbox recipients, generated on the first run; None when
        EVENTOS_OUTBOX_KEYS or EVENTOS_OUTBOX_KEYS_FILE is set (the services read that)."""
        if self.env.get(OUTBOX_KEYS_VAR) or self.env.get(OUTBOX_KEYS_FILE_VAR):
            return None
        path = self.state_dir / "outbox-keys"
        if not path.exists():
            _write_private(path, new_key_entry("local-1") + "\n")
        return path

    def _spawn_services(self) -> None:
        taken: set[int] = set()

        def pick() -> int:
            while (port := free_port(HOST)) in taken:
                pass
            taken.add(port)
            return port

        for name in names.SERVICES:
            if name == "workers-llm" and self.tier == "L":
                for c in LLM_CLASSES:
                    log_path = self.logs_dir / f"{name}-{c}.log"
                    self.services[f"{name}-{c}"] = ServiceProcess(
                        f"{name}-{c}", pick(), None, log_path, service=name,
                        own_env={"LLM_CLASS": c},
                    )  # fmt: skip
                continue
            grpc_port = pick() if name in GRPC_SERVICES else None
            log_path = self.logs_dir / f"{name}.log"
            self.services[name] = ServiceProcess(name, pick(), grpc_port, log_path)
        self._adopt_release()
        self.secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = self.service_env()
        self.say(f"starting {len(self.services)} services (logs in {STATE_DIR}/logs) …")
        for svc in self.services.values():
            svc.spawn(env, self.root)
            self._write_pids()

    def service_env(self) -> dict[str, str]:
        """What every service process sees: our environment plus the instance's settings."""
        env = dict(self.env)
        env.update(
            {
                "EVENTOS_DATABASE_URL": self.database_url,
                "TEMPORAL_ADDRESS": self.temporal_address,
                "TEMPORAL_NAMESPACE": self.temporal_namespace,
                "EVENTOS_ADMIN_TOKEN": self.admin_token,
                "EVENTOS_INTERNAL_TOKEN": self.internal_token,
                "EVENTOS_BIND_HOST": HOST,  # loopback: plaintext gRPC is allowed here
                "EVENTOS_INGRESS_SPOOL_DIR": str(self.state_dir / "spool"),
                "EVENTOS_SECRETS_DIR": str(self.secrets_dir),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.admin_token_file is not None:
            env["EVENTOS_ADMIN_TOKEN_FILE"] = str(self.admin_token_file)
        for var, value in EXAMPLE_OPERATOR_ENV.items():
            env.setdefault(var, value)
        # The operator's own logs: an exception's text is shown (redacted), not only its type.
        env.setdefault(LOG_EXCEPTIONS_VAR, LOG_EXCEPTION_TEXT)
        if self.outbox_keys_file is not None:
            env[OUTBOX_KEYS_FILE_VAR] = str(self.outbox_keys_file)
        for svc in self.services.values():
            env.update(svc.port_env())
            kicked = self.services.get(KICKS.get(svc.name, ""))
            if kicked is not None and kicked.grpc_address:
                env[svc.env_prefix + "_KICK"] = kicked.grpc_address
        return env

    def _wait_ready(self) -> None:
        """Every service answers 200 on /readyz before the deadline, or StackError."""
        deadline = time.monotonic() + self.ready_timeout_s
        pending = set(self.services)
        last: dict[str, str] = {}
        with httpx.Client(timeout=READYZ_PROBE_TIMEOUT_S) as client:
            while pending:
                self._check_stop()
                for name in sorted(pending):
                    svc = self.services[name]
                    code = svc.exit_code()
                    if code is not None:
                        raise StackError(
                            f"{name} exited with code {code} before it was ready; "
                            f"last lines of {svc.log_path}:\n{svc.tail()}"
                        )
                    try:
                        answer = client.get(svc.http_url + "/readyz")
                    except httpx.HTTPError as exc:
                        last[name] = f"{type(exc).__name__}: {exc}"
                        continue
                    if answer.status_code == 200:
                        pending.discard(name)
                    else:
                        last[name] = f"{answer.status_code} {answer.text[:300]}"
                if pending and time.monotonic() > deadline:
                    raise StackError(self._not_ready(pending, last))
                if pending:
                    self._stop.wait(READY_POLL_S)
        self.say("all services ready")

    def _not_ready(self, pending: set[str], last: dict[str, str]) -> str:
        parts = [f"not ready after {self.ready_timeout_s:g}s: {', '.join(sorted(pending))}"]
        for name in sorted(pending):
            svc = self.services[name]
            parts.append(f"--- {name}: /readyz said {last.get(name, 'nothing')}")
            parts.append(f"last lines of {svc.log_path}:\n{svc.tail()}")
        return "\n".join(parts)

    def _apply_examples(self) -> None:
        folder = self.examples_dir or self.root / "examples"
        shown = os.path.relpath(folder, self.root)
        self.say(f"applying the employees in {folder if shown.startswith('..') else shown}/ …")
        # Resolve secrets the way the services will: same variables, same secrets directory.
        store = SecretStore.from_env(self.service_env())
        self.employees = apply_examples(folder, self.ingress_url, self.admin_token, store)

    def _write_pids(self) -> None:
        doc = {
            "localstack": os.getpid(),
            "services": {n: s.recorded.to_json() for n, s in self.services.items() if s.recorded},
        }
        _write_private(self.pids_file, json.dumps(doc, indent=2) + "\n")

    def stack(self) -> dict[str, Any]:
        """Every address of the instance, as written to stack.json."""
        pids: dict[str, int | None] = {"localstack": os.getpid()}
        database: dict[str, Any] = {"url": self.database_url, "embedded": False}
        if self.postgres is not None and self.postgres.process is not None:
            pids["postgres"] = self.postgres.process.pid
            database.update(embedded=True, log=str(self.postgres.log_path))
        temporal: dict[str, Any] = {
            "tier": self.tier,
            "address": self.temporal_address,
            "namespace": self.temporal_namespace,
            "embedded": False,
        }
        if self.temporal is not None and self.temporal.process is not None:
            pids["temporal"] = self.temporal.process.pid
            temporal.update(embedded=True, log=str(self.temporal.log_path))
            if (ui := self.temporal_ui()) is not None:
                temporal["ui"] = ui
        if isinstance(self.temporal, TemporalServer):
            # What the upgrader reads: the version the server runs and the build it runs from.
            temporal.update(version=self.temporal.version,
                            build=str(self.temporal.tools.temporal_build()),
                            running=self.temporal.running())  # fmt: skip
        pids.update({n: s.pid for n, s in self.services.items()})
        return {
            "version": 1,
            "root": str(self.root),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "ingress_url": self.ingress_url,
            "admin_token": self.admin_token,
            "admin_token_file": str(self.admin_token_file) if self.admin_token_file else None,
            "internal_token": self.internal_token,
            "database": database,
            "temporal": temporal,
            "services": {n: s.to_json() for n, s in self.services.items()},
            "pids": pids,
            "python": sys.executable,
            "release": {
                "serial": self.release_serial,
                "release": self.release.as_json() if self.release else None,
            },
        }

    def _write_stack(self) -> None:
        _write_private(self.stack_file, json.dumps(self.stack(), indent=2) + "\n")

    # -- run -----------------------------------------------------------------------------

    def supervise(self) -> None:
        """Until a stop is requested, start again any process of the instance that exits
        (PostgreSQL, Temporal, a service), with a delay that grows while it keeps exiting
        within a minute of its start."""
        while not self._stop.wait(SUPERVISE_POLL_S):
            self.check_children()

    def check_children(self) -> None:
        """One supervision pass: the servers first (PostgreSQL before the tier L Temporal
        server, which keeps its databases there), then the services."""
        if time.monotonic() >= self._renew_at:
            renew(self.ports())
            self._renew_at = time.monotonic() + PORTS_RENEW_S
        self.apply_release_request()
        if self.heal_servers:
            for server in self.servers:
                if self._stop.is_set():
                    return
                if server.check(time.monotonic()):
                    self._write_stack()
        now = time.monotonic()
        for svc in self.services.values():
            code = svc.exit_code()
            if code is None or svc.held:
                continue
            if not svc.restarts.planned:
                delay = svc.restarts.plan(now - svc.started_at, now)
                self.say(
                    f"{svc.name} (pid {svc.pid}) {exit_text(code)}; "
                    f"restart {svc.restarts.count + 1} in {delay:g}s"
                )
                self.say(f"last lines of {svc.log_path}:\n{svc.tail()}")
            elif svc.restarts.due(now):
                self.restart_service(svc.name)

    def _adopt_release(self) -> None:
        """At start, the services run the release the last request named (an upgrade's), all
        of them and without its extra environment (a drill's ends with the run that made it)."""
        request = read_request(self.state_dir)
        if request is None:
            return
        self.release_serial = request.serial
        if request.release is not None and Path(request.release.python).exists():
            self.release = request.release
            self.say(f"services run release {self.release.name} ({self.release.checkout})")
        for svc in self.services.values():
            svc.python = self.release.python if self.release else ""

    def apply_release_request(self) -> None:
        """Apply a release request not applied yet: stop each service that should not run or
        runs another release or environment, start each that should run and does not."""
        request = read_request(self.state_dir)
        if request is None or request.serial == self.release_serial:
            return
        if request.temporal is not None:
            self._apply_temporal(request.temporal)
        python = request.release.python if request.release else ""
        for svc in self.services.values():
            wanted = request.runs(svc.service or svc.name)
            same = svc.python == python and svc.release_env == request.env
            running = svc.exit_code() is None and svc.pid is not None
            if running and (not wanted or not same):
                stop_groups([svc.pid], self.stop_timeout_s)  # type: ignore[list-item]
            svc.python, svc.release_env, svc.held = python, dict(request.env), not wanted
            if wanted and not (running and same):
                svc.restarts.due_at = 0.0
                svc.spawn(self.service_env(), self.root)
        self.release_serial, self.release = request.serial, request.release
        self._write_pids()
        self._write_stack()
        what = request.release.name if request.release else "its own release"
        runs = "all" if request.run is None else ", ".join(request.run) or "nothing"
        self.say(f"release request {request.serial} applied: {what}, running {runs}")

    def _apply_temporal(self, pin: TemporalPin) -> None:
        """Run the tier L Temporal server as `pin` says: stopped and not started again, or on
        its build (stopped and started on it when it runs another; its start updates the
        schemas to the build's version, a no-op after the upgrader's schema step)."""
        server = self.temporal
        if not isinstance(server, TemporalServer):
            self.say("release request: a Temporal pin without a tier L server, ignored")
            return
        supervised = next(s for s in self.servers if s.server is server)
        build = Path(pin.build)
        same = server.running() and server.tools.temporal_build() == build
        if same and pin.running:
            return
        if server.running():
            self.say(f"stopping the Temporal server {server.version} …")
            server.stop()
        supervised.held = not pin.running
        if not pin.running:
            self._write_stack()
            return
        server.tools = _on_build(server.tools, pin)
        self.say(f"starting the Temporal server {pin.version} ({build}) …")
        supervised.started_at = time.monotonic()
        try:
            server.start()
        except Exception as exc:  # the supervision starts it again; the upgrader sees it
            self.say(f"the Temporal server {pin.version} did not start: {exc}")
            server.stop()
        self._write_stack()

    def ports(self) -> list[int]:
        """Every port the instance's processes listen on."""
        held = [p for s in self.servers for p in s.ports()]
        for svc in self.services.values():
            held += [svc.http_port, *([svc.grpc_port] if svc.grpc_port else [])]
        return held

    def restart_service(self, name: str) -> None:
        """Stop `name` if it runs, start it again on the same ports."""
        svc = self.services[name]
        if svc.exit_code() is None and svc.pid is not None:
            stop_groups([svc.pid], self.stop_timeout_s)
        attempt = svc.restarts.begin()
        svc.spawn(self.service_env(), self.root)
        self._write_pids()
        self._write_stack()
        self.say(f"{name} restarted (pid {svc.pid}, restart {attempt})")

    # -- stop ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything this instance started: services, then Temporal, then PostgreSQL."""
        self._stop.set()
        running = [s.pid for s in self.services.values() if s.exit_code() is None and s.pid]
        if running:
            self.say("stopping services …")
            killed = stop_groups(running, self.stop_timeout_s)
            if killed:
                self.say(f"killed {killed} after {self.stop_timeout_s:g}s")
        if self.temporal is not None and self.temporal.running():
            self.say("stopping Temporal …")
            self.temporal.stop()
        if self.postgres is not None and self.postgres.process is not None:
            if self.postgres.process.poll() is None:
                self.say("stopping PostgreSQL …")
            self.postgres.stop()
        if self._lock.held:
            self.stack_file.unlink(missing_ok=True)
            self.pids_file.unlink(missing_ok=True)
        self._lock.release()

    def summary(self) -> str:
        """What runs where, and one command to try."""
        lines = [f"Event OS is ready (state in {STATE_DIR}/, logs in {STATE_DIR}/logs/)"]
        for svc in self.services.values():
            grpc = f"  gRPC {svc.grpc_address}" if svc.grpc_address else ""
            lines.append(f"  {svc.name:<17} {svc.http_url}{grpc}")
        lines.append(f"  {'PostgreSQL':<17} {self.database_url}")
        where = f"{self.temporal_address} ({self.temporal_namespace}, tier {self.tier})"
        lines.append(f"  {'Temporal':<17} {where}")
        if (ui := self.temporal_ui()) is not None:
            lines.append(f"  {'Temporal Web UI':<17} {ui}")
        lines.append(
            f"  {'addresses':<17} {STATE_DIR}/stack.json (admin and internal tokens inside)"
        )
        if "ingress" in self.services:
            console = f"{self.ingress_url}/console"
            lines.append(f"  {'web console':<17} {console} (sign in with {self.admin_token_at()})")
        for outcome in self.employees:
            lines.append(f"  {'employee':<17} {outcome.describe()}")
        lines += ["", f"Try:  {self.command_to_try()}", "Ctrl-C stops everything."]
        return "\n".join(lines)

    def temporal_ui(self) -> str | None:
        """The embedded dev server's Web UI (loopback), if this instance runs one."""
        if isinstance(self.temporal, TemporalDevServer):
            return self.temporal.ui_url
        return None

    def admin_token_at(self) -> str:
        """Where the token to paste into the console's sign-in is: the file the first run wrote,
        unless EVENTOS_ADMIN_TOKEN gave it."""
        if self.env.get("EVENTOS_ADMIN_TOKEN"):
            return "the admin token in $EVENTOS_ADMIN_TOKEN"
        return f"the admin token in {STATE_DIR}/admin-token"

    def command_to_try(self) -> str:
        """One command that shows the instance answering: with --wait it prints the reply
        (without, it prints only `queued` and the reply stays out of sight)."""
        ctl = Path(sys.executable).parent / "eventosctl"
        shown = os.path.relpath(ctl) if ctl.is_relative_to(Path.cwd()) else str(ctl)
        chatty = [e.name for e in self.employees if e.takes_chat]
        if chatty:
            return f'{shown} chat {chatty[0]} "hi" --wait'
        return f"{shown} list"


def _on_build(tools: ServerTools, pin: TemporalPin) -> ServerTools:
    """`tools` running the Temporal server build `pin` names."""
    return dataclasses.replace(tools, temporal_version=pin.version, temporal_dir=Path(pin.build))


def main(argv: list[str] | None = None) -> int:
    """`python -m eventos.local`: start, supervise until SIGINT/SIGTERM, stop."""
    parser = argparse.ArgumentParser(
        prog="python -m eventos.local",
        description="Run a local Event OS instance with its state in ./.eventos",
    )
    parser.add_argument("--examples", type=Path, help="specs to apply (default: ./examples)")
    parser.add_argument("--ready-timeout", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument(
        "--tier", choices=TIERS, default="S", help="S: the dev server; L: the full server"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    protect_logs()
    stack = LocalStack(
        Path.cwd(), examples_dir=args.examples, ready_timeout_s=args.ready_timeout, tier=args.tier
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stack.stopping:
            # Not print(): the handler may interrupt a print() and buffered streams refuse reentry.
            os.write(sys.stderr.fileno(), b"still stopping; please wait\n")
        stack.request_stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        stack.start()
        stack.say(stack.summary())
        stack.supervise()
    except StopRequested:
        pass
    except Exception as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        stack.stop()
    stack.say("stopped")
    return code
