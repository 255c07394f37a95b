"""The servers the local instance starts (embedded PostgreSQL, the Temporal server), supervised.

A server that exits is started again on its state (PostgreSQL's data directory, the dev server's
SQLite file, the tier L server's databases) and its ports, with the services' back-off
(eventos.local.restarts), and every step is said: what exited and how, when the next start is
due, and whether it came back. Without this a SIGKILLed dev server left the instance without
Temporal for good while its services kept retrying.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from eventos.local.embedded_pg import EmbeddedPostgres
from eventos.local.restarts import Restarts, exit_text
from eventos.local.temporal_dev import TemporalDevServer
from eventos.local.temporal_server import TemporalServer

Server = EmbeddedPostgres | TemporalDevServer | TemporalServer


@dataclass
class SupervisedServer:
    """One server of the instance and its restarts."""

    label: str
    server: Server
    say: Callable[[str], None]
    restarts: Restarts = field(default_factory=Restarts)
    started_at: float = field(default_factory=time.monotonic)
    held: bool = False  # stopped on purpose (a release request): not started again

    @property
    def pid(self) -> int | None:
        process = self.server.process
        return process.pid if process is not None else None

    def ports(self) -> list[int]:
        """Every port the server was given (its restarts listen on the same)."""
        server = self.server
        found = [server.port]
        if isinstance(server, TemporalDevServer):
            found += [server.http_port, server.metrics_port, server.ui_port]
        elif isinstance(server, TemporalServer):
            found += [server.http_port, server.metrics_port, *server.internal_ports.values()]
        return [port for port in found if port]

    def exited(self) -> int | None:
        """The return code once the server's process has exited, else None."""
        process = self.server.process
        return process.poll() if process is not None else None

    def check(self, now: float) -> bool:
        """One supervision pass: plan a start when the server has exited, make it when due;
        True when the server was started again."""
        code = self.exited()
        if self.held or code is None or (self.restarts.planned and not self.restarts.due(now)):
            return False
        if not self.restarts.planned:
            delay = self.restarts.plan(now - self.started_at, now)
            self.say(
                f"{self.label} (pid {self.pid}) {exit_text(code)}; restart "
                f"{self.restarts.count + 1} in {delay:g}s on the same state and ports "
                f"(log: {self.server.log_path})"
            )
            return False
        return self._restart()

    def _restart(self) -> bool:
        attempt = self.restarts.begin()
        self.started_at = time.monotonic()
        try:
            self.server.start()
        except Exception as exc:
            self.server.stop()  # a start that timed out may have left it running, unready
            delay = self.restarts.plan(0.0, time.monotonic())
            first = str(exc).strip().splitlines()[:1] or [type(exc).__name__]
            self.say(
                f"{self.label} restart {attempt} failed: {first[0]}; restart {attempt + 1} "
                f"in {delay:g}s"
            )
            return False
        self.say(f"{self.label} restarted (pid {self.pid}, restart {attempt})")
        return True
