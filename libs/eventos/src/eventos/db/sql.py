"""Named queries: `.sql` files of `-- name: <name>` blocks, a description line, the query."""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- name: ([a-z0-9_]+)\s*$", re.MULTILINE)

Queries = dict[str, LiteralString]


def parse_queries(text: str) -> Queries:
    """Split one file into {name: query}; the comment lines under a name are its description."""
    parts = _HEADER.split(text)
    queries: Queries = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.startswith("--")]
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = "\n".join(lines).strip()
    return queries


def load_queries() -> Queries:
    """Every named query shipped in `eventos/db/queries/*.sql`."""
    queries: Queries = {}
    folder = resources.files("eventos.db") / "queries"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            for name, query in parse_queries(entry.read_text()).items():
                if name in queries:
                    raise ValueError(f"query {name!r} is defined twice")
                queries[name] = query
    return queries


Q: Queries = load_queries()
