"""`eventosctl timeline` and `waiting` (docs/timeline.md, docs/cli.md)."""

from __future__ import annotations

import argparse
from typing import Any

from eventos.cli import output, watch
from eventos.cli.instance import owner_client
from eventos.cli.output import Column, emit, emit_one, table, time_columns
from eventos.client.owner_api import OwnerClient

FOLLOW_PAGE = 200

ENTRY_COLUMNS = [
    *time_columns("AT", lambda e: e["at"]),
    Column("KIND", lambda e: e["kind"], 16),
    Column("THREAD", lambda e: e["thread"], 18),
    Column("CHAIN", lambda e: e["chain_id"], wide=True),
    Column("REF", lambda e: e["ref"], wide=True),
    Column("SUMMARY", lambda e: e["summary"]),
]

WAITING_COLUMNS = [
    *time_columns("SINCE", lambda r: r["since"]),
    Column("THREAD", lambda r: r["thread"], 18),
    Column("SEQ", lambda r: r["seq"], 4),
    Column("CLASS", lambda r: f"C{r['class']}" if r["class"] else None, 5),
    Column("GATE", lambda r: r["gate"]["code"], 19),
    *time_columns("UNTIL", lambda r: r["gate"]["until"]),
    Column("STATUS", lambda r: r["status"], wide=True),
    Column("STREAM", lambda r: r["stream"], wide=True),
    Column("WHY", lambda r: r["gate"]["text"]),
]


def entry_line(e: dict[str, Any], wide: bool = False) -> str:
    """One timeline entry on one line."""
    return table([e], ENTRY_COLUMNS, wide=wide, header=False)[0]


def cmd_timeline(args: argparse.Namespace) -> int:
    client = owner_client(args)
    following = args.follow or args.watch
    stream = watch.start(client, {"employee": args.name}) if following else None
    filters = {"chain": args.chain, "thread": args.thread, "kind": args.kind,
               "since": args.since, "until": args.until}  # fmt: skip
    page = client.timeline(args.name, **filters, limit=args.limit)
    shown = list(reversed(page["timeline"]))  # the latest page, oldest first
    wide = output.form(args) == output.WIDE
    if stream is None:
        text = "\n".join(table(shown, ENTRY_COLUMNS, wide=wide)[1:])
        emit(args, page, text or f"nothing happened to {args.name}'s work in this range yet")
        return 0
    for e in shown:
        emit_one(args, e, entry_line(e, wide))
    cursor = page["follow_cursor"]
    for _ in watch.blocks(stream):  # an event of the employee, or a keep-alive: read on
        cursor = _follow(args, client, cursor, wide)
    return 0


def _follow(args: argparse.Namespace, client: OwnerClient, cursor: str, wide: bool) -> str:
    """Print the entries after `cursor` (in pages, under the timeline's horizon, so none is
    skipped or printed twice); the cursor to go on from."""
    while True:
        page = client.timeline(args.name, cursor=cursor, limit=FOLLOW_PAGE)
        for e in page["timeline"]:
            emit_one(args, e, entry_line(e, wide))
        if not page["next_cursor"]:
            return str(page["follow_cursor"])
        cursor = page["next_cursor"]


def waiting_lines(found: dict[str, Any], wide: bool = False) -> list[str]:
    """The header and one line per waiting input, and how many more there are."""
    lines = table(found["waiting"], WAITING_COLUMNS, wide=wide)
    if found["more"]:
        lines.append(f"... and {found['more']} more inputs not listed")
    return lines


def cmd_waiting(args: argparse.Namespace) -> int:
    found = owner_client(args).waiting(args.name, args.limit)
    if not found["waiting"]:
        text = f"nothing of {args.name}'s waits: every input is consumed"
        emit(args, found, text)
        return 0
    emit(args, found, "\n".join(waiting_lines(found)), "\n".join(waiting_lines(found, True)))
    return 0
