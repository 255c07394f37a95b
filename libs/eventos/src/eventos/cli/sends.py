"""`eventosctl approvals` and `outbox`: held sends and tool calls, and what the egress sent
(docs/egress.md; docs/cli.md)."""

from __future__ import annotations

import argparse
from typing import Any

from eventos.cli import times
from eventos.cli.instance import UsageError, owner_client
from eventos.cli.output import Column, emit, table, time_columns

OUTBOX_COLUMNS = [
    Column("ID", lambda r: r["id"], 6),
    Column("EMPLOYEE", lambda r: r["employee"], 14),
    Column("KIND", lambda r: r["kind"], 18),
    Column("STATUS", lambda r: r["status"], 7),
    *time_columns("UPDATED", lambda r: r["updated_at"]),
    Column("THREAD", lambda r: r.get("thread"), wide=True),
    Column("TURN", lambda r: r.get("turn_id"), wide=True),
    Column("ACCOUNT", lambda r: r.get("account"), wide=True),
    Column("CREATED", lambda r: times.exact(r.get("created_at")), wide=True),
    Column("WHY", lambda r: r.get("held_reason") or r.get("error")),
]
APPROVAL_WIDE = [
    Column("ID", lambda r: r["id"]),
    Column("EMPLOYEE", lambda r: r["employee"]),
    Column("KIND", lambda r: r["kind"]),
    Column("STATE", lambda r: r["state"]),
    Column("CHANNEL", lambda r: r.get("channel")),
    Column("AUDIENCE", lambda r: r.get("audience")),
    Column("EXPIRES", lambda r: times.exact(r["expires_at"])),
    Column("DECIDED BY", lambda r: r.get("decided_by")),
    Column("DRAFT", lambda r: (r.get("draft") or "").replace("\n", " ")[:80]),
]


def cmd_outbox(args: argparse.Namespace) -> int:
    client = owner_client(args)
    if args.action == "retry":
        if args.id is None or not args.id.isdigit():
            raise UsageError("outbox retry needs the row's ID (a number)")
        done = client.outbox_retry(int(args.id))
        emit(args, done, f"outbox/{done['id']} queued again; the egress sends it once")
        return 0
    rows = client.outbox(status=args.status, employee=args.employee)
    empty = "the outbox is empty" + (f" ({args.status})" if args.status else "")
    text, wide = (table(rows, OUTBOX_COLUMNS, wide=w) for w in (False, True))
    emit(args, rows, "\n".join(text if rows else [*text, empty]),
         "\n".join(wide if rows else [*wide, empty]))  # fmt: skip
    return 0


def _approval_lines(r: dict[str, Any]) -> str:
    draft = (r.get("draft") or "").replace("\n", " ")
    expires = times.ago(r["expires_at"])
    return (f"{r['id']}  {r['state']:<8} {r['channel'] or '-':<18} expires {expires}\n"
            f"    {draft[:200]}")  # fmt: skip


def cmd_approvals(args: argparse.Namespace) -> int:
    client = owner_client(args)
    if args.action in ("approve", "decline"):
        if not args.id:
            raise UsageError(f"approvals {args.action} needs the approval's ID")
        done = client.decide(args.id, args.action)
        emit(args, done, f"approval/{done['id']} {done['state']}; its send follows the decision")
        return 0
    rows = client.approvals(state=args.state)
    empty = "no approvals" + (f" ({args.state})" if args.state else "")
    text = "\n".join(_approval_lines(r) for r in rows) or empty
    emit(args, rows, text, "\n".join(table(rows, APPROVAL_WIDE)) if rows else empty)
    return 0
