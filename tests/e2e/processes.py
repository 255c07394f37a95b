"""Services as real processes (`python -m …`) for tests that kill them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from eventos.embedded_pg import free_port
from eventos.testing import wait_for_sync


@dataclass
class ServiceProcess:
    """One service started with `python -m <module>` on fixed free ports."""

    module: str
    name: str
    env: dict[str, str]
    log_dir: Path
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        prefix = "EVENTOS_" + self.name.upper().replace("-", "_")
        env = {**os.environ, **self.env,
               f"{prefix}_HTTP_PORT": str(self.http_port), f"{prefix}_GRPC_PORT": str(self.grpc_port)}  # fmt: skip
        log = (self.log_dir / f"{self.name}.log").open("ab")
        self.process = subprocess.Popen([sys.executable, "-m", self.module], env=env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        wait_for_sync(self.ready, timeout=30, what=f"{self.name} ready")

    def ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            log = (self.log_dir / f"{self.name}.log").read_text()[-3000:]
            raise AssertionError(f"{self.name} exited:\n{log}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def terminate(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(15)
