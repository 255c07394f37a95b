"""One service of the local instance run as a child process: `python -m eventos_<name>`."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eventos.local.processes import Recorded
from eventos.local.restarts import Restarts

HOST = "127.0.0.1"
LOG_TAIL_LINES = 40
LOG_TAIL_BYTES = 64 * 1024


@dataclass
class ServiceProcess:
    """A service's ports, log and process; the ports stay the same across restarts."""

    name: str
    http_port: int
    grpc_port: int | None
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    recorded: Recorded | None = None
    log_offset: int = 0
    restarts: Restarts = field(default_factory=Restarts)
    started_at: float = 0.0  # time.monotonic() of the last spawn
    # The service this process runs when its name is not one (workers-llm-c1 runs
    # workers-llm), and the settings of this process alone (LLM_CLASS).
    service: str = ""
    own_env: dict[str, str] = field(default_factory=dict)
    # The release it runs (eventos.local.releases): its Python ("" for the instance's own) and
    # the extra environment the upgrader gave it; `held` while a release request keeps it
    # stopped (the supervision does not start it again).
    python: str = ""
    release_env: dict[str, str] = field(default_factory=dict)
    held: bool = False

    @property
    def module(self) -> str:
        return "eventos_" + (self.service or self.name).replace("-", "_")

    @property
    def env_prefix(self) -> str:
        return "EVENTOS_" + (self.service or self.name).upper().replace("-", "_")

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def grpc_address(self) -> str | None:
        return f"{HOST}:{self.grpc_port}" if self.grpc_port else None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def argv(self) -> list[str]:
        return [self.python or sys.executable, "-m", self.module]

    def port_env(self) -> dict[str, str]:
        """The EVENTOS_<SERVICE>_HTTP_PORT / _GRPC_PORT settings."""
        env = {f"{self.env_prefix}_HTTP_PORT": str(self.http_port)}
        if self.grpc_port:
            env[f"{self.env_prefix}_GRPC_PORT"] = str(self.grpc_port)
        return env

    def spawn(self, env: dict[str, str], cwd: Path) -> None:
        """Start the process in its own session, appending to its log; its own settings and
        ports go over `env`'s."""
        env = {**env, **self.release_env, **self.own_env, **self.port_env()}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.argv()
        with self.log_path.open("ab") as log:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            log.write(f"--- {stamp} starting {self.name}\n".encode())
            log.flush()
            self.log_offset = log.tell()
            self.process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        self.recorded = Recorded(self.process.pid, " ".join(argv), str(cwd))

    def exit_code(self) -> int | None:
        """The exit code once the process has exited, else None (also None before spawn)."""
        return self.process.poll() if self.process is not None else None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines this run of the process wrote to its log."""
        try:
            with self.log_path.open("rb") as f:
                size = f.seek(0, 2)
                f.seek(max(self.log_offset, size - LOG_TAIL_BYTES))
                text = f.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def to_json(self) -> dict[str, Any]:
        return {
            "http": self.http_url,
            "grpc": self.grpc_address,
            "metrics": self.http_url + "/metrics",
            "pid": self.pid,
            "log": str(self.log_path),
            "python": self.python or sys.executable,
            "held": self.held,
        }
