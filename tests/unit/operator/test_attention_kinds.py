"""The attention kinds the code raises, held against docs/attention.md both ways.

A kind counts as raised where the source passes an `ATTENTION_*` constant to a raise: as the
`"kind"` of a dict in a function that runs a query inserting into `attention_items` (its SQL is
read from the named queries), or as an argument of a function of the same module that raises.
Every raised kind has its row in the doc's "Kinds" table and every row there is raised; every
`ATTENTION_*` constant of eventos/names.py is raised or named under "Not raised yet" with its
reason; and SPEC §12's list is covered by one or the other.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from eventos import names
from eventos.db.sql import Q

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = [ROOT / "libs" / "eventos" / "src" / "eventos",
            *sorted((ROOT / "services").glob("*/src"))]  # fmt: skip
GENERATED = ROOT / "libs" / "eventos" / "src" / "eventos" / "v1"
DOC = ROOT / "docs" / "attention.md"
INSERTS = re.compile(r"INSERT\s+INTO\s+attention_items\b", re.IGNORECASE)
ROW = re.compile(r"^\| `([a-z_]+)` \|")
# SPEC §12's list of attention items, each as the kinds that stand for it.
SPEC_LIST = {
    "quarantined thread": ["thread_quarantined"],
    "dead input": ["dead_input"],
    "unknown or failed send": ["send_unknown", "send_failed"],
    "budget high/max": ["budget_high", "budget_max"],
    "driver down": ["driver_down"],
    "Temporal problem": ["temporal_unavailable"],
    "stuck/slow/parked turn": ["stuck_turn", "slow_turn", "parked_turn"],
    "loop suppressed or breaker open": ["loop_suppressed", "breaker_open"],
    "missed alarm": ["missed_alarm"],
    "expired or expiring approval": ["approval_expired", "approval_expiring"],
}
CONSTANTS = {k: v for k, v in vars(names).items() if k.startswith("ATTENTION_")}
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _constant(node: ast.AST) -> str | None:
    """The name of an `ATTENTION_*` constant (`names.ATTENTION_X` or `ATTENTION_X`)."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name if isinstance(name, str) and name.startswith("ATTENTION_") else None


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _inserting_query(node: ast.AST) -> bool:
    """`Q["<name>"]` of a query that inserts into attention_items."""
    if not (isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Q"):
        return False
    key = node.slice
    return isinstance(key, ast.Constant) and INSERTS.search(Q.get(str(key.value), "")) is not None


def _raisers(tree: ast.Module) -> set[str]:
    """The module's functions that raise an item, directly or through one another."""
    functions = [n for n in ast.walk(tree) if isinstance(n, Function)]
    raising = {f.name for f in functions if any(map(_inserting_query, ast.walk(f)))}
    while True:
        more = {f.name for f in functions if f.name not in raising and any(
            isinstance(n, ast.Call) and _callee(n) in raising for n in ast.walk(f))}  # fmt: skip
        if not more:
            return raising
        raising |= more


def raised_in(source: str) -> set[str]:
    """The `ATTENTION_*` constants a module's source passes to a raise."""
    tree = ast.parse(source)
    raisers = _raisers(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, Function) and node.name in raisers:
            for d in (n for n in ast.walk(node) if isinstance(n, ast.Dict)):
                for key, value in zip(d.keys, d.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "kind":
                        found |= {c for c in [_constant(value)] if c}
        if isinstance(node, ast.Call) and _callee(node) in raisers:
            args = [*node.args, *(k.value for k in node.keywords)]
            found |= {c for c in map(_constant, args) if c}
    return found


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if GENERATED not in path.parents:
                yield path


def raised_kinds() -> set[str]:
    constants: set[str] = set()
    for path in sources():
        constants |= raised_in(path.read_text())
    unknown = constants - set(CONSTANTS)
    assert not unknown, f"raised constants missing from eventos/names.py: {sorted(unknown)}"
    return {CONSTANTS[c] for c in constants}


def documented(section: str) -> list[str]:
    """The kinds of one table of docs/attention.md (`## <section>`)."""
    text = DOC.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for line in body.splitlines() if (m := ROW.match(line))]


def test_every_kind_raised_is_documented_and_every_documented_kind_is_raised() -> None:
    raised, rows = raised_kinds(), documented("Kinds")
    assert len(rows) == len(set(rows)), "a kind has two rows in docs/attention.md"
    assert sorted(raised - set(rows)) == [], "raised but not in docs/attention.md's Kinds table"
    assert sorted(set(rows) - raised) == [], "in docs/attention.md's Kinds table, never raised"


def test_every_kind_named_is_raised_or_listed_as_not_raised_yet() -> None:
    raised, later = raised_kinds(), set(documented("Not raised yet"))
    assert sorted(raised & later) == [], "raised now: move its row to the Kinds table"
    silent = sorted(v for v in CONSTANTS.values() if v not in raised | later)
    assert silent == [], "ATTENTION_* constants neither raised nor listed as not raised yet"
    for entry, kinds in SPEC_LIST.items():
        missing = [k for k in kinds if k not in raised | later]
        assert missing == [], f"SPEC §12 {entry!r}: {missing} neither raised nor listed"


def test_the_scan_finds_each_form_of_raise_and_nothing_else() -> None:
    insert = next(n for n, q in Q.items() if INSERTS.search(q))
    resolve = next(n for n, q in Q.items() if "UPDATE attention_items" in q)
    code = f'''
async def direct(conn):
    await conn.execute(Q["{insert}"], {{"kind": names.ATTENTION_A, "ref": "r"}})

async def by_params(conn):
    params = {{"id": 1, "kind": names.ATTENTION_B}}
    await conn.execute(Q["{insert}"], params)

async def _helper(conn, kind):
    await direct_insert(conn, kind)

async def direct_insert(conn, kind):
    await conn.execute(Q["{insert}"], {{"kind": kind}})

async def caller(conn):
    await _helper(conn, names.ATTENTION_C)
    await self._helper(conn, kind=ATTENTION_D)

async def resolver(conn):
    await conn.execute(Q["{resolve}"], {{"kind": names.ATTENTION_E, "ref": "r"}})
    seen = names.ATTENTION_F == "x"
'''
    assert raised_in(code) == {"ATTENTION_A", "ATTENTION_B", "ATTENTION_C", "ATTENTION_D"}
