"""What a command prints (`-o`; docs/cli.md#output): a table (the default), `wide` (the table
with more columns), or the API's answer as `json` or `yaml`. Errors go to stderr, never here.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from eventos.cli import times

TEXT, JSON, YAML, WIDE = "text", "json", "yaml", "wide"
FORMATS = (TEXT, JSON, YAML, WIDE)
Row = dict[str, Any]


def form(args: argparse.Namespace) -> str:
    """The output format asked for (`--json` is `-o json`)."""
    return str(getattr(args, "output", None) or TEXT)


def structured(args: argparse.Namespace) -> bool:
    """Whether the API's answer is printed (json, yaml) rather than words."""
    return form(args) in (JSON, YAML)


def dump(doc: object, as_form: str) -> str:
    """`doc` as indented JSON or as YAML (which reads back as the same document)."""
    if as_form == YAML:
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).rstrip("\n")
    return json.dumps(doc, indent=2, ensure_ascii=False)


def emit(args: argparse.Namespace, doc: object, text: str, wide: str | None = None) -> None:
    """Print `doc` as JSON or YAML when asked, else the text (or its wide form)."""
    as_form = form(args)
    if as_form in (JSON, YAML):
        print(dump(doc, as_form), flush=True)
    else:
        print(wide if as_form == WIDE and wide is not None else text, flush=True)


def emit_one(args: argparse.Namespace, doc: object, text: str) -> None:
    """One more object of a watch or a follow: a JSON line, a YAML document, or its text."""
    as_form = form(args)
    if as_form == JSON:
        print(json.dumps(doc, ensure_ascii=False), flush=True)
    elif as_form == YAML:
        print("---\n" + dump(doc, YAML), flush=True)
    else:
        print(text, flush=True)


@dataclass(frozen=True)
class Column:
    """A table column: its title, its value in a row, its least width, whether only `wide`
    shows it, or only the default table (`narrow`: its `wide` twin says more)."""

    title: str
    value: Callable[[Row], object]
    width: int = 0
    wide: bool = False
    narrow: bool = False


AGO_WIDTH = 8  # `100d ago`
EXACT_WIDTH = 25  # `2026-12-05T03:04:05+01:00`


def time_columns(title: str, value: Callable[[Row], str | None]) -> list[Column]:
    """A time as one column: how long ago in the table, when (ISO 8601 with its offset) in
    `wide` (cli/times.py)."""
    return [Column(title, lambda r: times.ago(value(r)), AGO_WIDTH, narrow=True),
            Column(title, lambda r: times.exact(value(r)), EXACT_WIDTH, wide=True)]  # fmt: skip


def cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: Sequence[Row], columns: Sequence[Column], *, wide: bool = False,
          header: bool = True) -> list[str]:  # fmt: skip
    """The rows as aligned lines (the header first); without a header (a watch's next row)
    each column keeps its least width."""
    shown = [c for c in columns if not (c.narrow if wide else c.wide)]
    cells = [[cell(c.value(r)) for c in shown] for r in rows]
    widths = [max([c.width, len(c.title) if header else 0, *(len(row[i]) for row in cells)])
              for i, c in enumerate(shown)]  # fmt: skip
    lines = [[c.title for c in shown]] if header else []
    return ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
            for line in lines + cells]  # fmt: skip
