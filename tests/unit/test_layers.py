"""The import contracts of `make lint` (pyproject.toml `[tool.importlinter]`, docs/architecture.md)
hold on the code, and fail on a scratch copy of it given a cycle or an import across a layer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"eventos": ROOT / "libs/eventos/src/eventos"} | {
    src.name: src for src in ROOT.glob("services/*/src/eventos_*")
}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """The shared package and the six services, copied; PYTHONPATH puts the copy first."""
    for name, src in PACKAGES.items():
        shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def lint_imports(path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(path)}
    command = [str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def add_import(module: Path, line: str) -> None:
    """An import inside a function, as a cycle often hides: the graph counts it all the same."""
    module.write_text(module.read_text() + f"\n\ndef _scratch() -> None:\n    {line}\n")


def broken(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]


def test_the_code_keeps_every_contract(scratch: Path) -> None:
    result = lint_imports(scratch)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


def test_a_cycle_between_subsystems_fails(scratch: Path) -> None:
    # The spec validating tools by importing their registry: the cycle this layout broke.
    add_import(scratch / "eventos/spec/model.py", "from eventos.tools import registry  # noqa")
    result = lint_imports(scratch)
    assert result.returncode != 0
    assert broken(result) == ["No import cycle in any package BROKEN"]
    assert "No cycles are allowed in eventos.\n" in result.stdout
    assert "- .spec -> .tools (1 import)" in result.stdout


def test_a_cycle_between_modules_of_one_subsystem_fails(scratch: Path) -> None:
    add_import(scratch / "eventos/runtime/build.py", "from eventos.runtime import metrics  # noqa")
    result = lint_imports(scratch)
    assert result.returncode != 0
    assert broken(result) == ["No import cycle in any package BROKEN"]
    assert "No cycles are allowed in eventos.runtime.\n" in result.stdout
    assert "- .metrics -> .build (1 import)" in result.stdout


def test_a_lower_layer_importing_a_higher_one_fails(scratch: Path) -> None:
    add_import(scratch / "eventos/runtime/service.py", "from eventos.delivery import relay  # noqa")
    result = lint_imports(scratch)
    assert result.returncode != 0
    assert "eventos in layers (docs/architecture.md) BROKEN" in broken(result)
    assert "eventos.runtime is not allowed to import eventos.delivery" in result.stdout
    assert "eventos.runtime.service -> eventos.delivery.relay" in result.stdout


def test_the_shared_package_importing_a_service_fails(scratch: Path) -> None:
    add_import(scratch / "eventos/owner/chat.py", "from eventos_ingress import app  # noqa")
    result = lint_imports(scratch)
    assert result.returncode != 0
    assert "eventos imports no service BROKEN" in broken(result)
    assert "eventos.owner.chat -> eventos_ingress.app" in result.stdout


def test_a_new_subpackage_must_be_placed_in_a_layer(scratch: Path) -> None:
    (scratch / "eventos/unplaced").mkdir()
    (scratch / "eventos/unplaced/__init__.py").write_text('"""Not in any layer."""\n')
    result = lint_imports(scratch)
    assert result.returncode != 0
    assert "eventos in layers (docs/architecture.md) BROKEN" in broken(result)
    assert "eventos.unplaced" in result.stdout
