"""`eventosctl apply`, `list`, `get`, `describe` and the lifecycle commands (docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from eventos.cli import output, times, watch
from eventos.cli.instance import CliError, owner_client
from eventos.cli.output import Column, emit, emit_one, table
from eventos.client.owner_api import OwnerApiError, OwnerClient
from eventos.errors import SpecInvalid
from eventos.spec.model import yaml_documents

WAIT_POLL_S = 0.2
DELETED_EVENT = "employee.deleted"
LIST_FIELDS = ("name", "spec_sha256", "generation", "state", "pause_reason", "revision",
               "limits", "intent")  # fmt: skip


def _intent(r: dict[str, Any]) -> str | None:
    intent = r.get("intent")
    return f"{intent['kind']} {intent['state']}" if intent else None


EMPLOYEE_COLUMNS = [
    Column("NAME", lambda r: r["name"], 4),
    Column("STATE", lambda r: r["state"], 8),
    Column("GENERATION", lambda r: r["generation"], 10),
    Column("INTENT", _intent, 6),
    Column("PAUSE REASON", lambda r: r["pause_reason"], wide=True),
    Column("REVISION", lambda r: r["revision"], wide=True),
    Column("DAILY USD", lambda r: (r["limits"] or {}).get("daily_usd"), wide=True),
    Column("INTENT ID", lambda r: (r.get("intent") or {}).get("id"), wide=True),
    Column("SPEC", lambda r: r["spec_sha256"][:12], wide=True),
]


def cmd_apply(args: argparse.Namespace) -> int:
    client = owner_client(args)
    failed = 0
    for name in args.files:
        source = "stdin" if name == "-" else name
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text()
        except OSError as exc:
            raise CliError(f"cannot read {source}: {exc.strerror or exc}") from None
        kind = "application/json" if name.endswith(".json") else "application/yaml"
        try:
            if kind == "application/yaml":  # read here first: its errors name the file
                yaml_documents(text, source)
            applied = client.apply(text, content_type=kind)
        except SpecInvalid as exc:
            print(f"error: {source}: the spec is not valid YAML", file=sys.stderr)
            for path, message in exc.errors:
                print(f"  {path}: {message}", file=sys.stderr)
            failed += 1
            continue
        except OwnerApiError as exc:
            if exc.status in (401, 403):
                raise
            print(f"error: {source}: {exc}", file=sys.stderr)
            for path, message in exc.errors:
                print(f"  {path}: {message}", file=sys.stderr)
            failed += 1
            continue
        for item in applied:
            emit(args, item, _applied_line(client, item))
    return 1 if failed else 0


def _applied_line(client: OwnerClient, item: dict[str, Any]) -> str:
    verb = "created" if item["created"] else "configured" if item["changed"] else "unchanged"
    line = f"employee/{item['name']} {verb}"
    if item.get("draining") is not None:
        return line + f" (flags changed: generation {item['draining']} drains into a new one)"
    if item["changed"] and not item["created"]:
        state = client.get(item["name"])["state"]
        if state != "stopped":
            line += f" (generation keeps its snapshot while {state}: reset, then start)"
    return line


def _rows_text(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no employees; apply one with `eventosctl apply -f examples/hello.yaml`"
    return "\n".join(table(rows, EMPLOYEE_COLUMNS, wide=output.form(args) == output.WIDE))


def cmd_list(args: argparse.Namespace) -> int:
    client = owner_client(args)
    stream = watch.start(client, {"kind": "employee"}) if args.watch else None
    rows = client.list()
    if stream is None:
        emit(args, rows, _rows_text(args, rows))
        return 0
    emit_one(args, rows, _rows_text(args, rows))  # a watch's output is a JSON line each
    wide = output.form(args) == output.WIDE
    for event in watch.events(stream):
        row = _watched_row(client, event)
        if row is None:
            continue
        emit_one(args, row, table([row], EMPLOYEE_COLUMNS, wide=wide, header=False)[0])
    return 0


def _watched_row(client: OwnerClient, event: dict[str, Any]) -> dict[str, Any] | None:
    """The employee as it stands after an event; a deleted one shows as `deleted` once (None:
    it was deleted since this event, and its own event follows)."""
    if event["kind"] != DELETED_EVENT:
        try:
            return {k: v for k, v in client.get(event["employee"]).items() if k in LIST_FIELDS}
        except OwnerApiError as exc:
            if exc.status == 404:
                return None
            raise
    return {**dict.fromkeys(LIST_FIELDS), "name": event["employee"], "state": "deleted",
            "spec_sha256": ""}  # fmt: skip


def cmd_get(args: argparse.Namespace) -> int:
    if args.name is None:
        return cmd_list(args)
    if args.watch:
        raise CliError("get NAME --watch: watch the list instead (`eventosctl list --watch`)")
    row = owner_client(args).get(args.name)
    emit(args, row, _rows_text(args, [row]))
    return 0


def _degraded_line(degraded: dict[str, Any] | None) -> str:
    if not degraded:
        return "no"
    return f"since {times.exact(degraded['since'])}: {degraded['reason']}"


def _intent_line(intent: dict[str, Any] | None) -> str:
    if not intent:
        return "-"
    return f"{intent['id']} {intent['kind']} {intent['state']}"


def _details(row: dict[str, Any]) -> list[str]:
    spec = yaml.safe_dump(row["spec"], sort_keys=False).rstrip().replace("\n", "\n  ")
    return [
        f"name:        {row['name']}",
        f"state:       {row['state']}"
        + (f" ({row['pause_reason']})" if row["pause_reason"] else ""),
        f"generation:  {row['generation'] or '-'}",
        f"revision:    {row['revision'] if row['revision'] is not None else '-'}",
        f"limits:      {json.dumps(row['limits']) if row['limits'] else '-'}",
        f"intent:      {_intent_line(row.get('intent'))}",
        f"degraded:    {_degraded_line(row.get('degraded'))}",
        f"spec sha256: {row['spec_sha256']}",
        "spec:",
        "  " + spec,
    ]


DESCRIBED = 10  # attention items, timeline entries and waiting inputs shown


def cmd_describe(args: argparse.Namespace) -> int:
    from eventos.cli import operator, timeline  # they import this module's neighbours

    client = owner_client(args)
    row = client.get(args.name)
    open_items = {"state": "open,acked", "employee": args.name, "limit": DESCRIBED}
    doc = {
        "employee": row,
        "attention": client.attention(open_items),
        "timeline": client.timeline(args.name, limit=DESCRIBED),
        "waiting": client.waiting(args.name, DESCRIBED),
    }
    lines = _details(row)
    items = doc["attention"]["attention"]
    lines += ["", f"attention ({len(items)} open or acked):"]
    lines += ["  " + line for r in items for line in operator.item_lines(r).split("\n")]
    entries = list(reversed(doc["timeline"]["timeline"]))
    lines += ["", f"timeline (the latest {len(entries)}, oldest first):"]
    lines += ["  " + timeline.entry_line(e) for e in entries]
    waits = doc["waiting"]
    lines += ["", f"waiting ({len(waits['waiting']) + waits['more']} inputs):"]
    lines += ["  " + line for line in timeline.waiting_lines(waits)[1:]]
    emit(args, doc, "\n".join(lines))
    return 0


def cmd_lifecycle(args: argparse.Namespace) -> int:
    client = owner_client(args)
    body = {"conversation": args.conversation} if args.command == "interrupt" else None
    return _requested(args, client, client.lifecycle(args.name, args.command, body))


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete an employee that does not run (stop it first); a paused generation retires."""
    client = owner_client(args)
    done = client.delete(args.name)
    line = f"employee/{done['name']} deleted"
    if done["retired_generation"] is not None:
        line += f" (generation {done['retired_generation']} retired: intent "
        line += f"{_intent_line(done['intent'])})"
    emit(args, done, line + "; its history stays for its retention")
    return _wait_intent(args, client, done["intent"]) if done["intent"] else 0


def cmd_limits(args: argparse.Namespace) -> int:
    client = owner_client(args)
    return _requested(args, client, client.limits(args.name, {"daily_usd": args.daily_usd}))


def cmd_rearm(args: argparse.Namespace) -> int:
    client = owner_client(args)
    intent = client.rearm()
    emit(args, intent, f"intent {_intent_line(intent)}")
    return _wait_intent(args, client, intent)


def _requested(args: argparse.Namespace, client: OwnerClient, ref: dict[str, Any]) -> int:
    """Print the committed change and its intent; with --wait, wait until it is applied."""
    line = f"{ref['name']}: generation {ref['generation']} {ref['state']}"
    emit(args, ref, f"{line} (intent {_intent_line(ref['intent'])})")
    return _wait_intent(args, client, ref["intent"])


def _wait_intent(args: argparse.Namespace, client: OwnerClient, intent: dict[str, Any]) -> int:
    if not args.wait:
        return 0
    intent = client.wait_intent(intent, args.timeout, WAIT_POLL_S)
    if intent["state"] == "applying":
        last = f" (last attempt: {intent['outcome']})" if intent["outcome"] else ""
        raise CliError(f"intent {intent['id']} still applying after {args.timeout:g}s{last}")
    emit(args, intent, f"intent {_intent_line(intent)}: {intent['outcome']}")
    return 0 if intent["state"] == "applied" else 1
