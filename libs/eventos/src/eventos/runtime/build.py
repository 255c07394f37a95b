"""Which code runs: the eventos release and the build id (a hash of the package's source).

The metrics label every service with both (`eventos_build_info`), and every Temporal Worker of
this package runs under the build id, so a check can tell which code answered.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path

import temporalio

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
