"""Every top-level workflow start sets an explicit priority key (SPEC §7, §9).

An unkeyed start runs at the default priority and its children inherit it, so the build fails
on any `start_workflow`, `execute_workflow` or Schedule action in our code without
`priority=Priority(priority_key=...)`. Children (`start_child_workflow`) inherit their
parent's key and are not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCES = [ROOT / "libs", ROOT / "services", ROOT / "bench"]
STARTS = {"start_workflow", "execute_workflow", "ScheduleActionStartWorkflow"}


def called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def keyed(call: ast.Call) -> bool:
    """`priority=Priority(priority_key=<something>)` among the call's keywords."""
    for kw in call.keywords:
        v = kw.value
        if kw.arg == "priority" and isinstance(v, ast.Call) and called_name(v) == "Priority":
            return any(k.arg == "priority_key" for k in v.keywords)
    return False


def unkeyed_starts(text: str, where: str) -> list[str]:
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)]
    return [
        f"{where}:{node.lineno} {called_name(node)}"
        for node in sorted(calls, key=lambda n: n.lineno)
        if called_name(node) in STARTS and not keyed(node)
    ]


def python_files() -> list[Path]:
    return sorted(p for base in SOURCES for p in base.rglob("*.py") if "/v1/" not in str(p))


def test_every_top_level_start_sets_a_priority_key() -> None:
    files = python_files()
    starts = [f for f in files if any(s in f.read_text() for s in STARTS)]
    assert len(starts) >= 3, "the check found almost no starts: is it looking at the code?"
    missing = [m for f in files for m in unkeyed_starts(f.read_text(), str(f.relative_to(ROOT)))]
    assert missing == []


def test_the_check_catches_a_start_without_a_key() -> None:
    bad = """
async def go(client):
    await client.start_workflow("W", id="w", task_queue="q")
    await client.start_workflow("W", id="w", task_queue="q", priority=Priority(fairness_key="e"))
    await client.start_workflow("W", id="w", task_queue="q", priority=Priority(priority_key=1))
    ScheduleActionStartWorkflow("W", id="w", task_queue="q")
"""
    assert unkeyed_starts(bad, "x.py") == [
        "x.py:3 start_workflow", "x.py:4 start_workflow", "x.py:6 ScheduleActionStartWorkflow",
    ]  # fmt: skip
