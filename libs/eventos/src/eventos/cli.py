"""`eventosctl`: the owner's command line (SPEC §17 CLI).

It finds the instance from, in order: `--url`/`--token`, `--stack FILE`,
EVENTOS_URL/EVENTOS_ADMIN_TOKEN, then the `.eventos/stack.json` that `make run` writes (looked
up from the working directory upwards). `migrate` needs the database instead: `--database-url`,
EVENTOS_DATABASE_URL or the stack's database URL. Exit codes: 0 done, 1 refused or failed,
2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import yaml

from eventos.db import connect
from eventos.db.migrate import Migration, migrate
from eventos.errors import DatabaseUnavailable, EventOSError
from eventos.owner_client import InstanceTimeout, InstanceUnreachable, OwnerApiError, OwnerClient
from eventos.settings import DatabaseSettings

STACK_FILE = Path(".eventos") / "stack.json"
START_HINT = "start one with `make run`"


class CliError(EventOSError):
    """The command failed."""


WAIT_POLL_S = 0.2
FOLLOW_POLL_S = 1.0  # `timeline --follow` asks for what happened since, this often


def find_stack(start: Path) -> Path | None:
    """The nearest `.eventos/stack.json` in `start` or one of its parents."""
    for folder in [start, *start.parents]:
        if (folder / STACK_FILE).is_file():
            return folder / STACK_FILE
    return None


def load_stack(args: argparse.Namespace) -> dict[str, Any]:
    """The stack file named by --stack, else the nearest one; {} when there is none."""
    given: Path | None = getattr(args, "stack", None)
    path = given if given is not None else find_stack(Path.cwd())
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise CliError(f"no stack file at {path}; {START_HINT}") from None
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def owner_client(args: argparse.Namespace) -> OwnerClient:
    """The owner API client: flags, then --stack, then environment, then the nearest stack."""
    url: str | None = getattr(args, "url", None)
    token: str | None = getattr(args, "token", None)
    sources: list[Callable[[], dict[str, Any]]] = []
    if getattr(args, "stack", None) is not None:
        sources.append(lambda: load_stack(args))
    env = os.environ
    sources.append(
        lambda: {
            "ingress_url": env.get("EVENTOS_URL"),
            "admin_token": env.get("EVENTOS_ADMIN_TOKEN"),
        }
    )
    sources.append(lambda: load_stack(args))
    for source in sources:
        if url and token:
            break
        found = source()
        url = url or found.get("ingress_url")
        token = token or found.get("admin_token")
    if not url:
        raise CliError(
            f"no local instance found (no {STACK_FILE} here or above); {START_HINT}, "
            "or point --url / EVENTOS_URL at a running instance"
        )
    if not token:
        raise CliError("no admin token: pass --token or set EVENTOS_ADMIN_TOKEN")
    return OwnerClient(str(url), str(token))


def emit(args: argparse.Namespace, doc: object, text: str) -> None:
    """Print `doc` as JSON with --json, else the human text."""
    print(json.dumps(doc, indent=2) if getattr(args, "json", False) else text)


# -- commands ------------------------------------------------------------------------------


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
            applied = client.apply(text, content_type=kind)
        except OwnerApiError as exc:
            if exc.status == 401:
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
    if item["changed"] and not item["created"]:
        state = client.get(item["name"])["state"]
        if state != "stopped":
            line += f" (generation keeps its snapshot while {state}: reset, then start)"
    return line


def cmd_list(args: argparse.Namespace) -> int:
    rows = owner_client(args).list()
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no employees; apply one with `eventosctl apply -f examples/hello.yaml`")
        return 0
    width = max(4, *(len(r["name"]) for r in rows)) + 2
    print(f"{'NAME':<{width}}{'STATE':<10}{'GENERATION':<12}INTENT")
    for r in rows:
        intent = r.get("intent")
        last = f"{intent['kind']} {intent['state']}" if intent else "-"
        print(f"{r['name']:<{width}}{r['state']:<10}{r['generation'] or '-'!s:<12}{last}")
    return 0


def _intent_line(intent: dict[str, Any] | None) -> str:
    if not intent:
        return "-"
    return f"{intent['id']} {intent['kind']} {intent['state']}"


def _degraded_line(degraded: dict[str, Any] | None) -> str:
    if not degraded:
        return "no"
    return f"since {degraded['since']}: {degraded['reason']}"


def cmd_get(args: argparse.Namespace) -> int:
    if args.name is None:
        return cmd_list(args)
    row = owner_client(args).get(args.name)
    text = [
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
        yaml.safe_dump(row["spec"], sort_keys=False).rstrip().replace("\n", "\n  "),
    ]
    text[-1] = "  " + text[-1]
    emit(args, row, "\n".join(text))
    return 0


def cmd_lifecycle(args: argparse.Namespace) -> int:
    client = owner_client(args)
    body = {"conversation": args.conversation} if args.command == "interrupt" else None
    return _requested(args, client, client.lifecycle(args.name, args.command, body))


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


def cmd_chat(args: argparse.Namespace) -> int:
    client_id = args.id or f"cli-{uuid.uuid4().hex}"
    queued = owner_client(args).chat(args.name, args.text, client_id, args.session)
    again = " (already sent with this id)" if queued.get("duplicate") else ""
    emit(args, queued, f"message {queued['message_id']} {queued['status']}{again}")
    if args.wait:
        reply = wait_for_reply(
            owner_client(args), args.name, int(queued["message_id"]), args.timeout
        )
        emit(args, {"reply": reply}, reply)
    return 0


def wait_for_reply(client: OwnerClient, name: str, message_id: int, timeout_s: float) -> str:
    """Poll the message until its turn answered; CliError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = client.message(name, message_id)
        if found.get("reply") is not None:
            return str(found["reply"])
        if time.monotonic() > deadline:
            raise CliError(
                f"no reply within {timeout_s:g}s (message {message_id} is {found['status']})"
            )
        time.sleep(WAIT_POLL_S)


def cmd_users(args: argparse.Namespace) -> int:
    client = owner_client(args)
    if args.action == "add":
        created = client.user_add(args.name)
        emit(args, created, f"user/{created['name']} created; its token (shown once):\n"
                            f"{created['token']}")  # fmt: skip
    elif args.action == "remove":
        client.user_remove(args.name)
        emit(args, {"removed": args.name}, f"user/{args.name} removed")
    else:
        rows = client.users()
        text = "\n".join(f"{r['name']}  {r['created_at']}" for r in rows) or "no users"
        emit(args, rows, text)
    return 0


def cmd_outbox(args: argparse.Namespace) -> int:
    client = owner_client(args)
    if args.action == "retry":
        if args.id is None or not args.id.isdigit():
            raise CliError("outbox retry needs the row's ID (a number)")
        done = client.outbox_retry(int(args.id))
        emit(args, done, f"outbox/{done['id']} queued again; the egress sends it once")
        return 0
    rows = client.outbox(status=args.status, employee=args.employee)
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'ID':<8}{'EMPLOYEE':<16}{'KIND':<20}{'STATUS':<9}{'UPDATED':<27}WHY")
    for r in rows:
        why = r.get("held_reason") or r.get("error") or ""
        print(f"{r['id']:<8}{r['employee']:<16}{r['kind']:<20}{r['status']:<9}"
              f"{r['updated_at']:<27}{why}")  # fmt: skip
    if not rows:
        print("the outbox is empty" + (f" ({args.status})" if args.status else ""))
    return 0


def cmd_approvals(args: argparse.Namespace) -> int:
    client = owner_client(args)
    if args.action in ("approve", "decline"):
        if not args.id:
            raise CliError(f"approvals {args.action} needs the approval's ID")
        done = client.decide(args.id, args.action)
        emit(args, done, f"approval/{done['id']} {done['state']}; its send follows the decision")
        return 0
    rows = client.approvals(state=args.state)
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        draft = (r.get("draft") or "").replace("\n", " ")
        print(f"{r['id']}  {r['state']:<8} {r['channel'] or '-':<18} expires {r['expires_at']}\n"
              f"    {draft[:200]}")  # fmt: skip
    if not rows:
        print("no approvals" + (f" ({args.state})" if args.state else ""))
    return 0


def _as_json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", None) == "json" or bool(getattr(args, "json", False))


def _entry_line(e: dict[str, Any]) -> str:
    return f"{e['at'][:23]:<24}{e['kind']:<18}{(e['thread'] or '-'):<20}{e['summary']}"


def _pause(seconds: float) -> None:
    time.sleep(seconds)  # a seam: tests end a --follow here


def cmd_timeline(args: argparse.Namespace) -> int:
    client = owner_client(args)
    filters = {"chain": args.chain, "thread": args.thread, "kind": args.kind,
               "since": args.since, "until": args.until}  # fmt: skip
    page = client.timeline(args.name, **filters, limit=args.limit)
    if _as_json(args) and not args.follow:
        print(json.dumps(page, indent=2))
        return 0
    shown = list(reversed(page["timeline"]))  # the latest page, oldest first
    for e in shown:
        print(json.dumps(e) if _as_json(args) else _entry_line(e))
    if not shown and not _as_json(args):
        print(f"nothing happened to {args.name}'s work in this range yet")
    if not args.follow:
        return 0
    cursor = page["follow_cursor"]
    try:
        while True:
            _pause(FOLLOW_POLL_S)
            page = client.timeline(args.name, cursor=cursor, limit=200)
            for e in page["timeline"]:
                print(json.dumps(e) if _as_json(args) else _entry_line(e), flush=True)
            cursor = page["next_cursor"] or page["follow_cursor"]
    except KeyboardInterrupt:
        return 0


def cmd_waiting(args: argparse.Namespace) -> int:
    found = owner_client(args).waiting(args.name, args.limit)
    if _as_json(args):
        print(json.dumps(found, indent=2))
        return 0
    rows = found["waiting"]
    if not rows:
        print(f"nothing of {args.name}'s waits: every input is consumed")
        return 0
    print(f"{'SINCE':<21}{'THREAD':<20}{'SEQ':<6}{'CLASS':<6}{'GATE':<21}{'UNTIL':<21}WHY")
    for r in rows:
        gate = r["gate"]
        print(f"{r['since'][:19]:<21}{(r['thread'] or '-'):<20}{r['seq'] or '-'!s:<6}"
              f"{'C' + str(r['class']) if r['class'] else '-':<6}{gate['code']:<21}"
              f"{(gate['until'] or '-')[:19]:<21}{gate['text']}")  # fmt: skip
    if found["more"]:
        print(f"... and {found['more']} more inputs not listed")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    url = args.database_url or os.environ.get("EVENTOS_DATABASE_URL")
    if not url:
        url = load_stack(args).get("database", {}).get("url")
    if not url:
        raise CliError(f"no database: set EVENTOS_DATABASE_URL, or {START_HINT}")

    async def run() -> list[Migration]:
        conn = await connect(DatabaseSettings(url=url))
        async with conn:
            return await migrate(conn)

    try:
        applied = asyncio.run(run())
    except DatabaseUnavailable as exc:
        raise CliError(f"cannot reach the database at {_where(url)}: {exc}") from None
    for m in applied:
        print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        print(f"the database at {_where(url)} is up to date")
    return 0


def _where(url: str) -> str:
    """host:port/dbname of a database URL, without credentials."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(unparsable URL)"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


# -- parser --------------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    # Defaults are suppressed so the options work before and after the command alike.
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("instance")
    group.add_argument(
        "--stack",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="stack file of `make run` (default: the nearest .eventos/stack.json)",
    )
    group.add_argument("--url", default=argparse.SUPPRESS, help="ingress URL (or EVENTOS_URL)")
    group.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="admin or user token (or EVENTOS_ADMIN_TOKEN)",
    )
    group.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )
    return common


Command = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The `eventosctl` parser: one subcommand per owner action."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog="eventosctl", description="Drive an Event OS instance.", parents=[common]
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    p = add("apply", cmd_apply, "apply employee specs (YAML or JSON)")
    p.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="a spec file, '-' for stdin; repeatable",
    )
    add("get", cmd_get, "one employee (or all without NAME)").add_argument("name", nargs="?")
    add("list", cmd_list, "every employee and its live generation")

    def waits(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--wait", action="store_true", help="wait until the intent is applied")
        p.add_argument("--timeout", type=float, default=60.0, help="seconds --wait waits (60)")
        return p

    for action, text in [
        ("start", "start a new generation"),
        ("stop", "pause the live generation (running turns stop at their next step)"),
        ("resume", "resume a paused generation"),
        ("reset", "retire the live generation (start makes a new one)"),
        ("interrupt", "stop a conversation's running lower-class turn at its next step"),
    ]:
        p = waits(add(action, cmd_lifecycle, text))
        p.add_argument("name")
        if action == "interrupt":
            hint = "<lane>/<thread> (default: the owner's chat, talk/main)"
            p.add_argument("--conversation", default="talk/main", help=hint)
    p = waits(add("limits", cmd_limits, "set the live generation's limits (absolute values)"))
    p.add_argument("name")
    p.add_argument("--daily-usd", type=float, required=True, help="daily budget in USD")
    waits(add("rearm", cmd_rearm, "re-arm Temporal from the database (supervisors, schedules)"))
    p = add("chat", cmd_chat, "send the owner's message (queued; answers 'queued')")
    p.add_argument("name")
    p.add_argument("text")
    p.add_argument("--wait", action="store_true", help="wait for the reply and print it")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds --wait waits (60)")
    p.add_argument("--session", help="chat session (default: the owner's main session)")
    p.add_argument("--id", help="client message id (default: a fresh one; resend to dedupe)")
    p = add("users", cmd_users, "add, list or remove users (admin token; a user token chats)")
    p.add_argument("action", choices=["add", "list", "remove"])
    p.add_argument("name", nargs="?", help="the user's name (add, remove)")
    p = add("approvals", cmd_approvals, "list approvals, or approve or decline one")
    p.add_argument("action", nargs="?", choices=["list", "approve", "decline"], default="list")
    p.add_argument("id", nargs="?", help="the approval to decide")
    p.add_argument(
        "--state",
        choices=["pending", "approved", "declined", "expired"],
        help="only approvals in this state",
    )
    p = add("outbox", cmd_outbox, "list the outbox, or retry an unknown or failed send")
    p.add_argument("action", nargs="?", choices=["list", "retry"], default="list")
    p.add_argument("id", nargs="?", help="the row to retry")
    p.add_argument(
        "--status",
        choices=["held", "queued", "sending", "sent", "failed", "unknown", "expired"],
        help="only rows in this status",
    )
    p.add_argument("--employee", help="only this employee's rows")
    from eventos.operator.commands import add_commands  # it imports this module's helpers

    add_commands(add)

    p = add("timeline", cmd_timeline, "what happened to an employee's work, oldest first")
    p.add_argument("name")
    p.add_argument("--chain", help="only this chain (an event and what it caused)")
    p.add_argument("--thread", help="only this thread (main, t_…, peer_…)")
    p.add_argument("--kind", help="a family (input, turn, reply, alarm, task, tool, attention) "
                   "or kinds (turn.done), comma-separated")  # fmt: skip
    p.add_argument("--since", help="from this time (ISO 8601 with an offset)")
    p.add_argument("--until", help="before this time (ISO 8601 with an offset)")
    p.add_argument("--limit", type=int, default=50, help="entries of the latest page (50)")
    p.add_argument("--follow", action="store_true", help="then print new entries as they happen")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p = add("waiting", cmd_waiting, "every input not consumed yet and the gate that holds it")
    p.add_argument("name")
    p.add_argument("--limit", type=int, help="inputs listed (50; at most 200)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p = add("migrate", cmd_migrate, "apply the database migrations")
    p.add_argument("--database-url", help="(or EVENTOS_DATABASE_URL, else the stack's database)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    func: Command = args.func
    if args.command == "users" and args.action != "list" and not args.name:
        parser.error(f"users {args.action} needs a NAME")
    try:
        return func(args)
    except InstanceTimeout as exc:
        print(f"error: {exc}", file=sys.stderr)
    except InstanceUnreachable as exc:
        print(f"error: no local instance answers at {exc.url}; {START_HINT}", file=sys.stderr)
    except OwnerApiError as exc:
        print(f"error: {_refusal(exc)}", file=sys.stderr)
        for path, message in exc.errors:
            print(f"  {path}: {message}", file=sys.stderr)
    except EventOSError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return 1


def _refusal(exc: OwnerApiError) -> str:
    if exc.status == 401:
        return "the instance refused the token (401); check --token or EVENTOS_ADMIN_TOKEN"
    return f"{exc} ({exc.status})"
