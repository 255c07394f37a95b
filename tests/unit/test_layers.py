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


BROKEN_BY = {
    # The spec validating tools by importing their registry: the cycle this layout broke.
    "a cycle between subsystems": (
        "eventos/spec/model.py", "from eventos.tools import registry  # noqa",
        ["No import cycle in any package BROKEN"],
        ["No cycles are allowed in eventos.\n", "- .spec -> .tools (1 import)"],
    ),
    "a cycle between the modules of one subsystem": (
        "eventos/runtime/build.py", "from eventos.runtime import metrics  # noqa",
        ["No import cycle in any package BROKEN"],
        ["No cycles are allowed in eventos.runtime.\n", "- .metrics -> .build (1 import)"],
    ),
    "a lower layer importing a higher one": (
        "eventos/runtime/service.py", "from eventos.delivery import relay  # noqa",
        # the relay imports the runtime, so this is a cycle too
        ["eventos in layers (docs/architecture.md) BROKEN", "No import cycle in any package BROKEN"],
        ["eventos.runtime is not allowed to import eventos.delivery",
         "eventos.runtime.service -> eventos.delivery.relay"],
    ),
    "the shared package importing a service": (
        "eventos/owner/chat.py", "from eventos_ingress import app  # noqa",
        ["eventos imports no service BROKEN"],
        ["eventos.owner.chat -> eventos_ingress.app"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", BROKEN_BY)
def test_an_import_against_a_contract_fails(scratch: Path, case: str) -> None:
    module, line, contracts, said = BROKEN_BY[case]
    add_import(scratch / module, line)
    result = lint_imports(scratch)
    assert result.returncode != 0
    assert broken(result) == contracts
    for words in said:
        assert words in result.stdout


def test_a_new_subpackage_must_be_placed_in_a_layer(scratch: Path) -> None:
    (scratch / "eventos/unplaced").mkdir()
    (scratch / "eventos/unplaced/__init__.py").write_text('"""Not in any layer."""\n')
    result = lint_imports(scratch)
    assert result.returncode != 0
    assert "eventos in layers (docs/architecture.md) BROKEN" in broken(result)
    assert "eventos.unplaced" in result.stdout
