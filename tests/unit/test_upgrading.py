"""UPGRADING.md keeps up with the code: every migration file and every patch marker of the
workflows is named in it, every migration it names exists, and its newest release is the
package's version (a migration or a marker cannot land without its line)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from eventos.runtime.build import release

ROOT = Path(__file__).resolve().parents[2]
UPGRADING = ROOT / "UPGRADING.md"
WORKFLOWS = ROOT / "libs/eventos/src/eventos/workflows"
MIGRATIONS_DIR = ROOT / "libs/eventos/src/eventos/db/migrations"
MIGRATION_NAME = re.compile(r"\b\d{4}_[a-z0-9_]+\.sql\b")
RELEASE_HEADING = re.compile(r"^## (\S+)", re.MULTILINE)
PATCH_CALLS = {"patched", "deprecate_patch"}
# What each release's section says besides its migrations' lines.
SECTION_PARTS = ["**Rolling back", "**Patch markers added", "**Retired", "**Operators"]


def text() -> str:
    return UPGRADING.read_text()


def shipped() -> list[str]:
    return sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql"))


def test_every_migration_file_is_named_once_and_every_name_is_a_file() -> None:
    named = MIGRATION_NAME.findall(text())
    assert shipped(), MIGRATIONS_DIR
    assert sorted(set(shipped()) - set(named)) == [], "add the migration's line to UPGRADING.md"
    assert sorted(set(named) - set(shipped())) == [], "UPGRADING.md names a migration no file has"
    assert sorted(n for n in set(named) if named.count(n) > 1) == []


def markers(source: str) -> set[str]:
    """The patch ids a workflow module passes to `workflow.patched` / `deprecate_patch`, by
    literal or by a module-level constant."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }
    found = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in PATCH_CALLS and node.args):  # fmt: skip
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
            elif isinstance(arg, ast.Name):
                found.add(constants[arg.id])
    return found


def test_every_patch_marker_of_the_workflows_is_named() -> None:
    used = set().union(*(markers(p.read_text()) for p in WORKFLOWS.glob("*.py")))
    assert used, "no marker found: the reading of workflow.patched broke"
    assert sorted(m for m in used if f"`{m}`" not in text()) == []


def test_markers_are_read_by_literal_and_by_constant() -> None:
    source = 'P = "by-constant"\nif workflow.patched(P) or workflow.deprecate_patch("lit"):\n  x'
    assert markers(source) == {"by-constant", "lit"}


def version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))


def test_the_newest_release_is_the_package_version_and_each_says_what_it_must() -> None:
    releases = RELEASE_HEADING.findall(text())
    assert releases, "UPGRADING.md has no release section"
    assert releases[0] == release(), (
        f"eventos is {release()}: open its section at the top of UPGRADING.md"
    )
    assert releases == sorted(releases, key=version_key, reverse=True), "newest first"
    sections = RELEASE_HEADING.split(text())[2::2]
    for name, section in zip(releases, sections, strict=True):
        missing = [part for part in SECTION_PARTS if part not in section]
        assert missing == [], f"UPGRADING.md, {name}: say {missing}"
