"""The local instance of the fault run, and the faults done to it.

It is `make run`'s instance (eventos.local.instance.LocalStack): embedded PostgreSQL, the Temporal
server of the tier (the dev server at tier S, the full server at tier L), the six services as
processes, and the instance's own supervision, which restarts a service that exits. The
instance would start PostgreSQL and Temporal again too; here the harness does (heal_servers off),
to hold each outage for the length it chose, the way a production deployment would: the server
comes back on the same state and ports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from eventos.local.instance import LocalStack
from eventos.local.service_process import ServiceProcess

TEMPORAL = "temporal"
POSTGRES = "postgres"
# Whatever the caller's environment names, the instance runs its own servers: it stops them.
AMBIENT = ("EVENTOS_DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "EVENTOS_ADMIN_TOKEN",
           "EVENTOS_SECRETS_DIR", "EVENTOS_INTERNAL_TOKEN", "EVENTOS_OUTBOX_KEYS",
           "EVENTOS_OUTBOX_KEYS_FILE")  # fmt: skip
READY_PROBE_S = 2.0
EXIT_WAIT_S = 30.0


@dataclass
class Instance:
    """One local instance in `root/.eventos`, supervised in a thread while it runs."""

    root: Path
    specs: Path
    env: Mapping[str, str]
    tier: str = "S"
    say: Callable[[str], None] = print
    stack: LocalStack = field(init=False)
    _supervisor: threading.Thread | None = None
    # One fault at a time: a server coming back is not restarted by anyone else meanwhile.
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        env = {k: v for k, v in {**os.environ, **self.env}.items() if k not in AMBIENT}
        self.stack = LocalStack(self.root, examples_dir=self.specs, tier=self.tier, env=env,
                                ready_timeout_s=180.0, say=self.say,
                                heal_servers=False)  # fmt: skip

    def start(self) -> None:
        """Start everything (the specs applied and started) and its supervision."""
        self.stack.start()
        self._supervisor = threading.Thread(target=self.stack.supervise, name="supervise",
                                            daemon=True)  # fmt: skip
        self._supervisor.start()

    def stop(self) -> None:
        self.stack.request_stop()
        if self._supervisor is not None:
            self._supervisor.join(10)
        self.stack.stop()

    @property
    def database_url(self) -> str:
        return self.stack.database_url

    @property
    def ingress_url(self) -> str:
        return self.stack.ingress_url

    @property
    def ingress_grpc(self) -> str:
        return str(self.stack.services["ingress"].grpc_address)

    @property
    def admin_token(self) -> str:
        return self.stack.admin_token

    def services(self) -> list[str]:
        """The service processes a fault may kill (one per LLM class at tier L)."""
        return list(self.stack.services)

    def ready(self) -> bool:
        """Every service answers /readyz with 200 and both servers run."""
        if self.stack.postgres is None or self.stack.temporal is None:
            return False
        if not (self.stack.temporal.running() and self.stack.postgres.process is not None
                and self.stack.postgres.process.poll() is None):  # fmt: skip
            return False
        with httpx.Client(timeout=READY_PROBE_S) as client:
            return all(_answers(client, s) for s in self.stack.services.values())

    def not_ready(self) -> list[str]:
        """The services not answering /readyz with 200 (for a progress line)."""
        with httpx.Client(timeout=READY_PROBE_S) as client:
            return [n for n, s in self.stack.services.items() if not _answers(client, s)]

    def kill(self, target: str, down: Callable[..., None]) -> None:
        """SIGKILL `target` (a service or Temporal); `down` is called once it is gone. The
        instance's supervision restarts a service; Temporal is restarted here at once on the
        same state, as its pod would be."""
        with self._lock:
            if target == TEMPORAL:
                self._kill_temporal()
                down()
                self._start_temporal()
                return
            process = self.stack.services[target].process
            assert process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # its process group: nothing left over
            process.wait(EXIT_WAIT_S)
            down()

    def lose_temporal(self, seconds: float, down: Callable[..., None],
                      up: Callable[..., None]) -> None:  # fmt: skip
        """SIGKILL Temporal, keep it down `seconds`, start it again on the same state; `down`
        is called once it is gone, `up` just before it starts."""
        with self._lock:
            self._kill_temporal()
            down()
            time.sleep(seconds)  # the outage itself: nothing to wait on
            up()
            self._start_temporal()

    def lose_postgres(self, seconds: float, down: Callable[..., None],
                      up: Callable[..., None]) -> None:  # fmt: skip
        """Stop PostgreSQL the hard way (immediate shutdown: no checkpoint, crash recovery on
        the next start), keep it down `seconds`, start it again on the same data and port."""
        pg = self.stack.postgres
        assert pg is not None and pg.process is not None
        with self._lock:
            pg.process.send_signal(signal.SIGQUIT)
            pg.process.wait(EXIT_WAIT_S)
            down()
            time.sleep(seconds)  # the outage itself: nothing to wait on
            up()
            pg.start(timeout=120.0)

    def revive(self) -> None:
        """Start Temporal again if it exited by itself (at tier L it may while PostgreSQL,
        which holds its databases, is lost), as its pod would be restarted."""
        server = self.stack.temporal
        with self._lock:
            if (
                server is not None
                and server.process is not None
                and server.process.poll() is not None
            ):
                self.say(
                    f"Temporal exited with code {server.process.returncode}; starting it again"
                )
                server.start()

    def _kill_temporal(self) -> None:
        server = self.stack.temporal
        assert server is not None and server.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(EXIT_WAIT_S)

    def _start_temporal(self) -> None:
        server = self.stack.temporal
        assert server is not None
        server.start()


def _answers(client: httpx.Client, svc: ServiceProcess) -> bool:
    if svc.exit_code() is not None or svc.process is None:
        return False
    try:
        return client.get(f"{svc.http_url}/readyz").status_code == 200
    except httpx.HTTPError:
        return False
