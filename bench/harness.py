"""What the bench drivers share: a database, service subprocesses, CPU accounting, tables.

Every process started here is stopped by the `Stack` it was registered on (also on Ctrl-C,
SIGTERM or an error), and asks the kernel for SIGTERM should this driver die without
cleaning up (PR_SET_PDEATHSIG), so a killed bench leaves nothing running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from eventos.db import connect
from eventos.db.migrate import migrate
from eventos.local.embedded_pg import EmbeddedPostgres
from eventos.local.instance import LocalStack
from eventos.local.ports import free_port
from eventos.settings import DatabaseSettings, TemporalSettings
from eventos.testing import wait_for_sync

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
ADMIN_TOKEN = "bench-admin-token-0123456789"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
_PR_SET_PDEATHSIG = 1
_STARTED = time.monotonic()
NAN = float("nan")


class BenchError(Exception):
    """The bench could not run (a service did not start, a check could not be made)."""


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the seconds since the driver started."""
    print(f"[{time.monotonic() - _STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a forked child: get `sig` when the bench driver dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def exit_on_signals() -> None:
    """SIGINT and SIGTERM unwind, so every `finally` stops what it started.

    SIGINT is set explicitly: a shell without job control starts background commands with
    SIGINT ignored, and Python would keep it ignored.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGUSR1, dump_stacks)


def dump_stacks(signum: int, frame: FrameType | None) -> None:
    """SIGUSR1: every thread's stack and every asyncio task's, on stderr (what a driver that
    seems stuck is waiting for; the smoke tests ask for it before they stop one)."""
    faulthandler.dump_traceback(all_threads=True)
    try:
        tasks = asyncio.all_tasks(asyncio.get_running_loop())
    except RuntimeError:
        tasks = set()  # not inside the event loop
    for task in tasks:
        print(f"--- {task!r}", file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


@dataclass
class BenchPostgres(EmbeddedPostgres):
    """The embedded server, asked to shut down fast should the bench driver die."""

    death_signal: int = signal.SIGINT


@dataclass
class ServiceProc:
    """One service running as a child process, with its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    http_port: int
    grpc_port: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            progress(f"{self.name} did not stop in {STOP_TIMEOUT_S:.0f}s; killing it")
            self.proc.kill()
            self.proc.wait()


@dataclass
class Stack:
    """A temporary work directory and everything started in it, stopped in reverse order."""

    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="eventos-bench-")))
    postgres_pid: int = 0
    _exit: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __enter__(self) -> Stack:
        self._exit.callback(shutil.rmtree, self.workdir, ignore_errors=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit.close()

    def database(self) -> str:
        """EVENTOS_DATABASE_URL, else a fresh durable embedded PostgreSQL; migrated."""
        url = os.environ.get("EVENTOS_DATABASE_URL")
        if not url:
            pg = BenchPostgres(self.workdir / "pg", durable=True)
            progress("starting embedded PostgreSQL (durable: fsync on) ...")
            pg.start()
            self._exit.callback(self._stop_pg, pg)
            url = pg.create_database("eventos_bench")
            self.postgres_pid = pg.process.pid if pg.process else 0
        else:
            progress("using EVENTOS_DATABASE_URL (its CPU is not measured)")
        asyncio.run(_migrate(url))
        return url

    @staticmethod
    def _stop_pg(pg: EmbeddedPostgres) -> None:
        progress("stopping PostgreSQL")
        pg.stop()

    def service(
        self,
        name: str,
        args: Sequence[str],
        env: dict[str, str],
        http_port: int,
        grpc_port: int = 0,
        *,
        wait: bool = True,
    ) -> ServiceProc:
        """Start `python <args>` and wait until its /readyz answers 200 (unless not `wait`:
        then `wait_ready` does, so that several services start side by side)."""
        log_path = self.workdir / f"{name}.log"
        with log_path.open("ab") as log_file:
            proc = subprocess.Popen(
                [PYTHON, *args],
                cwd=ROOT,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the driver only; it stops us in order
                preexec_fn=die_with_parent,
            )
        svc = ServiceProc(name, proc, log_path, http_port, grpc_port)
        self._exit.callback(self._stop_service, svc)
        if wait:
            self.wait_ready(svc)
        return svc

    @staticmethod
    def wait_ready(*services: ServiceProc) -> None:
        """Wait until each of `services` answers /readyz with 200."""
        for svc in services:
            _wait_ready(svc)
            progress(f"{svc.name} ready (pid {svc.pid}, http {svc.http_port})")

    @staticmethod
    def _stop_service(svc: ServiceProc) -> None:
        progress(f"stopping {svc.name}")
        svc.stop()

    def on_exit(self, fn: Callable[[], object]) -> None:
        self._exit.callback(fn)


async def _migrate(url: str) -> None:
    conn = await connect(DatabaseSettings(url=url))
    try:
        await migrate(conn)
    finally:
        await conn.close()


def _wait_ready(svc: ServiceProc) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not svc.alive():
                raise BenchError(f"{svc.name} exited; its log ends with:\n{svc.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{svc.base_url}/readyz").status_code == 200:
                    return
            time.sleep(0.1)
    raise BenchError(f"{svc.name} not ready after {READY_TIMEOUT_S:.0f}s:\n{svc.tail()}")


def free_ports(n: int) -> list[int]:
    """`n` distinct free TCP ports on 127.0.0.1."""
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


def ingress_args(profile_to: Path | None) -> list[str]:
    """How to run the real ingress service; under cProfile when asked."""
    if profile_to is None:
        return ["-m", "eventos_ingress"]
    progress(f"ingress runs under cProfile (-> {profile_to}): its figures are not comparable")
    return ["-m", "cProfile", "-o", str(profile_to), "-m", "eventos_ingress"]


def start_router(stack: Stack, url: str, *, wait: bool = True) -> ServiceProc:
    """The real router service (`python -m eventos_router`)."""
    http, grpc_port = free_ports(2)
    env = {
        "EVENTOS_DATABASE_URL": url,
        "EVENTOS_ROUTER_HTTP_PORT": str(http),
        "EVENTOS_ROUTER_GRPC_PORT": str(grpc_port),
    }
    return stack.service("router", ["-m", "eventos_router"], env, http, grpc_port, wait=wait)


def start_ingress(
    stack: Stack,
    url: str,
    *,
    router: ServiceProc | None,
    env: dict[str, str],
    profile_to: Path | None = None,
    wait: bool = True,
) -> ServiceProc:
    """The real ingress service (`python -m eventos_ingress`), kicking the router if any."""
    http, grpc_port = free_ports(2)
    full = {
        "EVENTOS_DATABASE_URL": url,
        "EVENTOS_ADMIN_TOKEN": ADMIN_TOKEN,
        "EVENTOS_INGRESS_HTTP_PORT": str(http),
        "EVENTOS_INGRESS_GRPC_PORT": str(grpc_port),
        "EVENTOS_INGRESS_SPOOL_DIR": str(stack.workdir / "spool"),
        **env,
    }
    if router is not None:
        full["EVENTOS_INGRESS_KICK"] = f"127.0.0.1:{router.grpc_port}"
    return stack.service("ingress", ingress_args(profile_to), full, http, grpc_port, wait=wait)


def apply_employee(base_url: str, spec_yaml: str, name: str) -> None:
    """Apply one employee spec through the owner API and start it."""
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=base_url, headers=auth, timeout=30.0) as client:
        r = client.post(
            "/v1/employees", content=spec_yaml, headers={"content-type": "application/yaml"}
        )
        if r.status_code != 200:
            raise BenchError(f"applying {name} failed: {r.status_code} {r.text[:500]}")
        r = client.post(f"/v1/employees/{name}:start")
        if r.status_code != 202:  # committed; the relay's deliverer applies the intent
            raise BenchError(f"starting {name} failed: {r.status_code} {r.text[:500]}")


def wait_running(stack: LocalStack, count: int, timeout_s: float) -> None:
    """Until `count` of the local instance's employees are running (a start applied after
    `stack.start` stopped waiting for it shows `starting` for a while)."""

    def running() -> bool:
        headers = {"Authorization": f"Bearer {stack.admin_token}"}
        r = httpx.get(f"{stack.ingress_url}/v1/employees", headers=headers, timeout=10)
        return [e["state"] for e in r.json()["employees"]].count("running") >= count

    wait_for_sync(running, timeout=timeout_s, interval=1, what=f"{count} employees running")


def local_employee(name: str, triggers: str) -> str:
    """An employee whose one agent `front` runs on the instant local model, with `triggers` (a
    YAML flow list)."""
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}}}]
  triggers: {triggers}
"""


def scalar(url: str, query: str, params: Sequence[object] = ()) -> int:
    """One integer from the database."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query.encode(), params).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def wait_routed(url: str, source_like: str, timeout: float = 60.0) -> float:
    """Wait until the router has settled every accepted row of the sources; seconds waited."""
    started = time.monotonic()
    query = "SELECT count(*) FROM bus_ingress WHERE status = 'accepted' AND source_key LIKE %s"
    while scalar(url, query, (source_like,)) > 0:
        if time.monotonic() - started > timeout:
            raise BenchError(f"the router left rows unrouted after {timeout:.0f}s")
        time.sleep(0.2)
    return time.monotonic() - started


# --- CPU accounting -------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, float, float]:
    """(parent pid, own CPU seconds, reaped children's CPU seconds) of `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2 :].split()
    own = (int(fields[11]) + int(fields[12])) / _TICK
    reaped = (int(fields[13]) + int(fields[14])) / _TICK
    return int(fields[1]), own, reaped


def children(pid: int) -> list[tuple[int, float]]:
    """The live children of `pid`: (pid, own CPU seconds) each."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid, own, _ = _proc_stat(int(entry.name))
            if ppid == pid:
                found.append((int(entry.name), own))
    return found


def cpu_seconds(pid: int, *, tree: bool = False) -> float:
    """CPU seconds used by `pid` (and, with `tree`, by its live and reaped children)."""
    if pid <= 0:
        return 0.0
    try:
        _, own, reaped = _proc_stat(pid)
    except (OSError, ValueError):
        return 0.0
    if not tree:
        return own
    return own + reaped + sum(child_own for _, child_own in children(pid))


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy (anyone's work), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    guest = sum(ticks[8:10])  # already counted in user and nice
    return (sum(ticks) - idle - guest) / _TICK


CALIBRATION_LOOPS = 2_000_000


def calibration_ms() -> float:
    """Milliseconds of CPU for a fixed pure-Python loop: this host's speed at the time of the
    run. CPU figures of runs on different hosts (or beside different neighbours: these
    machines are shared) compare after dividing by it: a tier L fleet run measured 110 ms of
    CPU per event one day and 198 ms the next, with the same code."""
    start = time.process_time()
    total = 0
    for i in range(CALIBRATION_LOOPS):
        total += i % 7
    return (time.process_time() - start) * 1000


def calibration_line() -> str:
    best = min(calibration_ms() for _ in range(3))
    return f"calibration: a fixed Python loop took {best:.0f} ms of CPU (this host's speed)"


@dataclass
class CpuMeter:
    """CPU used by named processes over one phase, as % of one core; `machine` is everyone's."""

    pids: dict[str, tuple[int, bool]]
    _start: dict[str, float] = field(default_factory=dict)
    _wall: float = 0.0

    def _sample(self) -> dict[str, float]:
        used = {n: cpu_seconds(p, tree=t) for n, (p, t) in self.pids.items() if p}
        used["machine"] = machine_busy_seconds()
        return used

    def start(self) -> None:
        self._wall = time.monotonic()
        self._start = self._sample()

    def stop(self) -> dict[str, float]:
        wall = max(1e-9, time.monotonic() - self._wall)
        now = self._sample()
        return {n: 100.0 * (now[n] - self._start[n]) / wall for n in now}


def instance_processes(pids: dict[str, int | None]) -> dict[str, tuple[int, bool]]:
    """What a CpuMeter reads of a local instance (`stack.stack()["pids"]`): each process but
    the launcher itself (the bench's own), PostgreSQL with its backends."""
    return {n: (pid, n == "postgres") for n, pid in pids.items()
            if pid is not None and n != "localstack"}  # fmt: skip


def cpu_summary(usage: dict[str, float]) -> str:
    return ", ".join(f"{name} {pct:.0f}%" for name, pct in usage.items())


def others_cpu(usage: dict[str, float], *extra: float) -> float:
    """CPU % of processes that are not ours (the machine's busy time minus ours)."""
    ours = sum(v for k, v in usage.items() if k != "machine") + sum(extra)
    return max(0.0, usage.get("machine", NAN) - ours)


# --- output ---------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        pairs = enumerate(zip(r, widths, strict=True))
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs)

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def fmt(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:.{digits}f}"  # NaN: nothing was measured


def counts(c: dict[str, int]) -> str:
    return ",".join(f"{k}x{v}" for k, v in c.items()) or "0"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


MISSED_EXIT = 3  # a gated driver's exit code when a target was missed (1: the driver failed)


@dataclass
class Targets:
    """A gated driver's targets: each check prints PASS or MISS, and the exit code follows.

    A run that checked nothing (it stopped before its report) is no pass either.
    """

    missed: list[str] = field(default_factory=list)
    checked: int = 0

    def check(self, name: str, ok: bool) -> str:
        """PASS or MISS for the target `name`, remembered for the exit code."""
        self.checked += 1
        if not ok:
            self.missed.append(name)
        return verdict(ok)

    def exit_code(self, args: argparse.Namespace) -> int:
        """0 when every target passed, or for a smoke run (`--quick`) or `--no-fail`; else
        MISSED_EXIT (1 when no target was checked at all)."""
        if not self.checked:
            print("targets: none checked (the run stopped before its report)")
            return 1
        if not self.missed:
            print(f"targets: all {self.checked} PASS")
            return 0
        print(f"targets: {len(self.missed)} of {self.checked} MISS: " + "; ".join(self.missed))
        if getattr(args, "quick", False) or getattr(args, "no_fail", False):
            print("  (exit 0: --quick or --no-fail)")
            return 0
        return MISSED_EXIT


def add_no_fail(parser: argparse.ArgumentParser) -> None:
    """`--no-fail`: a gated driver exits 0 whatever its targets say (for exploration)."""
    parser.add_argument(
        "--no-fail",
        action="store_true",
        help=f"exit 0 even when a target is missed (else {MISSED_EXIT})",
    )


@contextlib.contextmanager
def interrupt_guard() -> Iterator[None]:
    """Turn Ctrl-C and SIGTERM into a short message; the stack has already cleaned up."""
    exit_on_signals()
    try:
        yield
    except KeyboardInterrupt:
        progress("interrupted; everything started was stopped")
        raise SystemExit(130) from None
    except BenchError as exc:
        progress(f"bench failed: {exc}")
        raise SystemExit(1) from None


def parse_with_quick(
    parser: argparse.ArgumentParser, tiny: dict[str, Any], argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """The driver's arguments, with `--quick`: a smoke run of the same code path end to end at
    the sizes `tiny` (seconds of work), whose figures say that it runs, not how fast."""
    sizes = ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in tiny.items())
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {sizes}")
    args = parser.parse_args(argv)
    if args.quick:
        progress(f"--quick: a smoke run ({sizes}); its figures are not a measurement")
        for key, value in tiny.items():
            setattr(args, key, value)
    return args


@contextlib.contextmanager
def fresh_database(folder: Path, prefix: str) -> Iterator[str]:
    """The URL of an empty database of this run alone (not migrated).

    With EVENTOS_DATABASE_URL, a new database on that server, dropped at the end (the drivers
    that read whole tables need one of their own); else an embedded PostgreSQL in `folder`.
    """
    given = os.environ.get("EVENTOS_DATABASE_URL")
    if not given:
        pg = EmbeddedPostgres(folder / "pg", durable=False)
        pg.start()
        try:
            yield pg.create_database("eventos")
        finally:
            pg.stop()
        return
    name = f"{prefix}_{os.getpid()}_{int(time.time())}"
    progress(f"using a fresh database {name} on EVENTOS_DATABASE_URL's server")
    with psycopg.connect(given, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(given) | {"dbname": name}
    try:
        yield psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items() if v})
    finally:
        with psycopg.connect(given, autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(name)))


@contextlib.contextmanager
def temporal_server(folder: Path) -> Iterator[TemporalSettings]:
    """TEMPORAL_ADDRESS (and TEMPORAL_NAMESPACE) when set, else a dev server in `folder`."""
    if os.environ.get("TEMPORAL_ADDRESS"):
        settings = TemporalSettings.from_env()
        progress(f"using TEMPORAL_ADDRESS {settings.address}, namespace {settings.namespace}")
        yield settings
        return
    # Imported here: the webhook drivers need no Temporal, and it takes a second to import.
    from eventos.local.temporal_dev import TemporalDevServer

    server = TemporalDevServer(folder / "temporal")
    server.start()
    try:
        yield TemporalSettings(address=server.address, namespace=server.namespace)
    finally:
        server.stop()


def run_in_temp_folder(prefix: str, main: Callable[[Path], Coroutine[Any, Any, None]]) -> int:
    """Run `main(folder)` in a fresh temporary folder, removed afterwards (also on Ctrl-C)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        asyncio.run(main(folder))
    except KeyboardInterrupt:
        print("interrupted")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


class ServerCounters:
    """The Temporal server's own counters for one namespace, from its Prometheus endpoint:
    actions (`action`, what Temporal Cloud would bill), workflow tasks completed and Signals
    (with or without start) its frontend was sent."""

    def __init__(self, url: str | None, namespace: str) -> None:
        self.url = url
        self.namespace = namespace.replace("-", "_")  # the server's label values use _

    def read(self) -> dict[str, float]:
        if self.url is None:
            return {}
        text = httpx.get(self.url, timeout=10).text
        counts = {"actions": 0.0, "workflow tasks": 0.0, "signals": 0.0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if labels.get("namespace") != self.namespace:
                    continue
                name = sample.name.removesuffix("_total")
                if name == "action":
                    counts["actions"] += sample.value
                elif name == "service_requests" and labels.get("service_name") == "frontend":
                    op = labels.get("operation")
                    if op == "RespondWorkflowTaskCompleted":
                        counts["workflow tasks"] += sample.value
                    elif op in ("SignalWorkflowExecution", "SignalWithStartWorkflowExecution"):
                        counts["signals"] += sample.value
        return counts


def metrics_url(stack: LocalStack, given: str | None) -> str | None:
    if given:
        return given
    server = stack.temporal
    return f"http://127.0.0.1:{server.metrics_port}/metrics" if server is not None else None
