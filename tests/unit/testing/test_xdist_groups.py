"""`--dist loadgroup` sends the tests of one `xdist_group` (and every tier L test) to one worker
by the `@<group>` its worker adds to their ids (eventos.testing.plugin): under pytest 9 the
suffix pytest-xdist 3.8 sets alone never reached an id, and every group was spread over the
workers (each started its own tier L server and its own upgrade instance)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = """
import pytest


@pytest.mark.xdist_group("upgrade")
@pytest.mark.parametrize("n", range(2))
def test_grouped(n: int) -> None:
    pass


@pytest.mark.tier_l
def test_tier_l() -> None:
    pass


def test_free() -> None:
    pass
"""
# What a loadgroup worker's configuration says (xdist sets it on its workers only).
WORKER = """
def pytest_configure(config):
    config.option.loadgroup = True
"""


def test_a_loadgroup_workers_ids_name_each_tests_group(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text(WORKER)
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
            "-p", "eventos.testing.plugin", "-W", "ignore", f"--rootdir={tmp_path}",
            str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert ids == [
        "test_grouped.py::test_grouped[0]@upgrade",
        "test_grouped.py::test_grouped[1]@upgrade",
        "test_grouped.py::test_tier_l@tier-l",
        "test_grouped.py::test_free",
    ], done.stdout
