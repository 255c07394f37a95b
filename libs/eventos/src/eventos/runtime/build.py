"""Which code runs: the eventos release, the build id (a hash of the package's source), and the
release record a deployment pins (docs/deploy.md#releases).

The metrics label every service with them (`eventos_build_info`), `/livez` and `/readyz` carry the
record, and every Temporal Worker of this package runs under the build id, so a check (an
upgrade's, an operator's) can tell which code answers.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import temporalio

from eventos.db.migrate import shipped_migrations
from eventos.settings import ReleaseSettings

PACKAGE_ROOT = Path(__file__).parents[1]  # eventos/, whose source the build id hashes


def release() -> str:
    """The installed eventos distribution's version, or `unknown`."""
    try:
        return importlib.metadata.version("eventos")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def worker_build_id() -> str:
    """The build id every Worker of this package runs under: a hash of the eventos source.

    Without one, each process's first Worker hashes the bytecode of every loaded module, and
    where no .pyc exists (a fresh install, PYTHONDONTWRITEBYTECODE) compiles each again: on a
    loaded machine seconds of CPU at boot, on the event loop, while /readyz cannot answer.
    Reading the package's files takes milliseconds. Worker versioning is off: the id only
    labels the code that completed each workflow task."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return f"eventos-{digest.hexdigest()[:16]}-temporalio-{temporalio.__version__}"


@functools.cache
def migration_level() -> int:
    """The highest migration this code ships (and applies): the schema it expects."""
    return max(m.version for m in shipped_migrations())


@dataclass(frozen=True)
class Release:
    """A release as a deployment pins it: the code (eventos version and build id), the images'
    tag, the chart's version, the Temporal server's version and the migration level."""

    version: str
    build: str
    image_tag: str
    chart: str
    temporal_server: str
    migrations: int

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def running_release(deployed: ReleaseSettings | None = None) -> Release:
    """This process's release: the code's own parts, and what the deployment named
    (`ReleaseSettings`: the images' tag, the chart's version, the Temporal server)."""
    deployed = deployed or ReleaseSettings.from_env()
    return Release(
        version=release(), build=worker_build_id(), image_tag=deployed.image_tag,
        chart=deployed.chart, temporal_server=deployed.temporal_server,
        migrations=migration_level(),
    )  # fmt: skip
