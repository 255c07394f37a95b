"""Services as real processes (`python -m …`) for tests that kill them."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import httpx

from eventos.local.ports import free_port
from eventos.local.service_process import ServiceProcess
from eventos.runtime.service import READYZ_PROBE_TIMEOUT_S
from eventos.testing import wait_for_sync


@dataclass
class Running:
    """One service process on fixed ports, restartable, that a test may kill."""

    proc: ServiceProcess
    env: dict[str, str]
    cwd: Path

    @classmethod
    def of(cls, service: str, env: dict[str, str], log_dir: Path, suffix: str = "") -> Running:
        """`service` as a process named `service-suffix` when a suffix is given."""
        name = f"{service}-{suffix}" if suffix else service
        proc = ServiceProcess(name, free_port(), free_port(), log_dir / f"{name}.log")
        proc.service = service
        return cls(proc, env, log_dir)

    @property
    def grpc_target(self) -> str:
        return str(self.proc.grpc_address)

    @property
    def url(self) -> str:
        return self.proc.http_url

    def start(self) -> None:
        self.proc.spawn({**os.environ, **self.env, **self.proc.port_env()}, self.cwd)
        wait_for_sync(self.ready, timeout=30, what=f"{self.proc.name} ready")

    def ready(self) -> bool:
        if self.proc.exit_code() is not None:
            raise AssertionError(f"{self.proc.name} exited:\n{self.proc.tail()}")
        try:
            answer = httpx.get(f"{self.url}/readyz", timeout=READYZ_PROBE_TIMEOUT_S)
            return answer.status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind."""
        assert self.proc.process is not None
        self.proc.process.kill()
        self.proc.process.wait(10)

    def terminate(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        process = self.proc.process
        assert process is not None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        return process.wait(15)
