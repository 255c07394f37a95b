"""Which release the local instance's services run, and how another one is installed beside it
(the files the upgrader and `make run` share; eventos.local applies them).

A release of the local instance is a checkout of this project with its own environment: the
upgrader (`eventosctl upgrade --to CHECKOUT`) builds that environment under
`.eventos/releases/<key>/venv` with the Makefile's uv from the checkout's own lock (cached: the
same checkout and lock reuse it), then asks the running instance to run the services from it.

The request is a file, `.eventos/release-request.json`: which release (its Python), the extra
environment of its services (the drill switch), which services run at all, and at tier L which
Temporal server build runs (or that none does, while a restore replaces its databases). The
instance
(`LocalStack.check_children`) applies a request it has not applied yet — it stops what differs
and starts what should run — and names the applied request's serial in `stack.json`
(`release`), which is how the upgrader knows that its request took.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eventos.errors import EventOSError

REQUEST_FILE = "release-request.json"
RELEASES_DIR = "releases"
STAMP = ".eventos-release"
# What decides a release environment's content: the lock and the workspace's project files.
LOCK_FILES = ("uv.lock", "pyproject.toml", "libs/eventos/pyproject.toml")
MAKEFILE = "Makefile"
TEMPORAL_PIN = "TEMPORAL_SERVER_VERSION"  # the Makefile's pin of the tier L Temporal server
OUTPUT_TAIL = 2000  # characters of a failed command's output kept in the error


class ReleaseError(EventOSError):
    """A release could not be installed or read."""


@dataclass(frozen=True)
class LocalRelease:
    """A release of the local instance: its name, its checkout and the Python that runs it."""

    name: str
    checkout: str
    python: str

    def as_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LocalRelease:
        return cls(str(doc["name"]), str(doc["checkout"]), str(doc["python"]))


@dataclass(frozen=True)
class TemporalPin:
    """The tier L Temporal server a request asks for: its version, the build folder it runs
    from (`.tools/temporal-server/v<version>`), and whether it runs at all."""

    version: str
    build: str
    running: bool = True

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TemporalPin:
        return cls(str(doc["version"]), str(doc["build"]), bool(doc.get("running", True)))


@dataclass(frozen=True)
class ReleaseRequest:
    """What the services should run: `release` (None: the instance's own code), the extra
    environment of every service, which services run (None: all) and the Temporal server
    (None: the one the instance started with)."""

    serial: int
    release: LocalRelease | None = None
    env: dict[str, str] = field(default_factory=dict)
    run: list[str] | None = None
    temporal: TemporalPin | None = None

    def as_json(self) -> dict[str, Any]:
        return {"serial": self.serial, "env": self.env, "run": self.run,
                "release": self.release.as_json() if self.release else None,
                "temporal": self.temporal.as_json() if self.temporal else None}  # fmt: skip

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ReleaseRequest:
        rel = doc.get("release")
        run = doc.get("run")
        temporal = doc.get("temporal")
        return cls(
            serial=int(doc["serial"]),
            release=LocalRelease.from_json(rel) if isinstance(rel, dict) else None,
            env={str(k): str(v) for k, v in dict(doc.get("env") or {}).items()},
            run=[str(n) for n in run] if isinstance(run, list) else None,
            temporal=TemporalPin.from_json(temporal) if isinstance(temporal, dict) else None,
        )

    def runs(self, service: str) -> bool:
        return self.run is None or service in self.run


def read_request(state_dir: Path) -> ReleaseRequest | None:
    """The request in `state_dir`, or None when there is none or it cannot be read."""
    try:
        return ReleaseRequest.from_json(json.loads((state_dir / REQUEST_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_request(state_dir: Path, request: ReleaseRequest) -> None:
    """Replace the request atomically (the instance may read it at any moment)."""
    path = state_dir / REQUEST_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(request.as_json(), indent=2) + "\n")
    tmp.replace(path)


def makefile_pin(checkout: Path, name: str) -> str:
    """The value the checkout's Makefile gives `name` (`NAME := value`); "" when it gives none."""
    try:
        lines = (checkout / MAKEFILE).read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":=", 1)[1].strip() for line in lines
                 if line.split(":=", 1)[0].strip() == name and ":=" in line), "")  # fmt: skip


def find_uv(configured: str = "") -> str:
    """The uv that builds release environments: EVENTOS_UPGRADE_UV, else the Makefile's
    (`.tools/bin/uv` beside this environment's checkout), else the one on PATH."""
    if configured:
        return configured
    beside = Path(sys.prefix).parent / ".tools" / "bin" / "uv"
    if beside.exists():
        return str(beside)
    found = shutil.which("uv")
    if found is None:
        raise ReleaseError("no uv to build the release with: set EVENTOS_UPGRADE_UV")
    return found


def release_key(checkout: Path) -> str:
    """The cache key of a checkout's environment: its path and its lock files."""
    digest = hashlib.sha256(str(checkout).encode())
    for name in LOCK_FILES:
        path = checkout / name
        digest.update(name.encode() + (path.read_bytes() if path.exists() else b""))
    return digest.hexdigest()[:16]


def install(checkout: Path, state_dir: Path, uv: str, timeout_s: float) -> LocalRelease:
    """The checkout's environment, built from its lock unless a cached one matches."""
    checkout = checkout.resolve()
    if not (checkout / "uv.lock").is_file() or not (checkout / "libs" / "eventos").is_dir():
        raise ReleaseError(f"{checkout} is not a checkout of Event OS (no uv.lock, libs/eventos)")
    key = release_key(checkout)
    venv = state_dir / RELEASES_DIR / key / "venv"
    release = LocalRelease(f"{checkout.name}@{key[:8]}", str(checkout), str(venv / "bin/python"))
    if (venv / STAMP).exists():
        return release
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv), "UV_PYTHON": sys.executable}
    argv = [uv, "sync", "--frozen", "--all-packages", "--no-dev", "--compile-bytecode"]
    run(argv, checkout, env, timeout_s, what=f"installing {checkout}")
    (venv / STAMP).write_text(json.dumps(release.as_json()) + "\n")
    return release


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float, what: str) -> str:
    """Run a command to its end within `timeout_s`; its output, or ReleaseError with its tail."""
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ReleaseError(f"{what}: no end after {timeout_s:g}s") from None
    except OSError as exc:
        raise ReleaseError(f"{what}: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-OUTPUT_TAIL:]
        took = time.monotonic() - started
        raise ReleaseError(f"{what}: exit {done.returncode} after {took:.1f}s\n{tail}")
    return done.stdout
