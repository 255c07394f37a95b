"""`eventosctl dead-letters`, `replay` and `attention` (SPEC §17 CLI; docs/cli.md).

`replay` asks first: without `--yes` it prints what the selector would replay and asks on the
terminal (anything but `y` replays nothing, exit 1); with `--yes` it confirms with the token the
instance gave. `attention --watch` prints each item again as it changes, over the operator
event stream. Exit codes as every command (docs/cli.md#exit-codes).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from eventos.cli import output, times, watch
from eventos.cli.instance import CliError, UsageError, owner_client
from eventos.cli.output import Column, emit, emit_one, table
from eventos.client.owner_api import OwnerClient

SELECTOR_KEYS = ("id", "reason", "source", "employee", "since", "until")
SHOWN = 10
Add = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]


def parse_selector(text: str) -> dict[str, Any]:
    """`key=value,…` (keys id (repeatable), reason, source, employee, since, until) or a JSON
    object, as the API's selector."""
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--selector is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise UsageError("--selector must be a JSON object")
        return doc
    selector: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in SELECTOR_KEYS or not value:
            raise UsageError(f"--selector: {part!r} is not one of {'=…, '.join(SELECTOR_KEYS)}=…")
        if key == "id":
            selector.setdefault("ids", []).append(value)
        else:
            selector[key] = value
    if not selector:
        raise UsageError("--selector names nothing; e.g. --selector reason=filter_error")
    return selector


def _letter_line(r: dict[str, Any]) -> str:
    replayed = f"replayed as ingress-{r['replayed_as']}" if r["replayed_as"] else "-"
    return (f"{r['id']:<18}{r['reason']:<18}{times.ago(r['at']):<10}{r['source']:<28}"
            f"{r['employee'] or '-':<16}{replayed}\n    {r['preview']}")  # fmt: skip


LETTER_WIDE = [
    Column("ID", lambda r: r["id"]),
    Column("REASON", lambda r: r["reason"]),
    Column("AT", lambda r: times.exact(r["at"])),
    Column("SOURCE", lambda r: r["source"]),
    Column("EMPLOYEE", lambda r: r["employee"]),
    Column("STREAM", lambda r: r["stream"]),
    Column("TYPE", lambda r: r["type"]),
    Column("SIZE", lambda r: r["size"]),
    Column("CHAIN", lambda r: r["chain_id"]),
    Column("REPLAYED AS", lambda r: r["replayed_as"] and f"ingress-{r['replayed_as']}"),
    Column("DETAIL", lambda r: r["detail"]),
]


def _more(page: dict[str, Any]) -> list[str]:
    return [f"more: --cursor {page['next_cursor']}"] if page["next_cursor"] else []


def cmd_dead_letters(args: argparse.Namespace) -> int:
    query = {"reason": args.reason, "source": args.source, "employee": args.employee,
             "since": args.since, "until": args.until, "replayed": args.replayed,
             "limit": args.limit, "cursor": args.cursor}  # fmt: skip
    page = owner_client(args).dead_letters(query)
    rows = page["dead_letters"]
    lines = [f"{'ID':<18}{'REASON':<18}{'AT':<10}{'SOURCE':<28}{'EMPLOYEE':<16}REPLAYED"]
    lines += [_letter_line(r) for r in rows] or ["no dead letters"]
    wide = table(rows, LETTER_WIDE) if rows else ["no dead letters"]
    emit(args, page, "\n".join(lines + _more(page)), "\n".join(wide + _more(page)))
    return 0


def _ask(count: int) -> bool:
    try:
        answer = input(f"replay these {count} dead letters? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_replay(args: argparse.Namespace) -> int:
    client, selector = owner_client(args), parse_selector(args.selector)
    seen = client.replay(selector)
    before = f" ({seen['already_replayed']} already replayed)" if seen["already_replayed"] else ""
    if not seen["count"]:
        emit(args, seen, f"nothing to replay{before}")
        return 0
    if not output.structured(args):
        print(f"{seen['count']} dead letters would be replayed{before}:")
        for r in seen["sample"]:
            print("  " + _letter_line(r).replace("\n", "\n  "))
        if seen["count"] > len(seen["sample"]):
            print(f"  … and {seen['count'] - len(seen['sample'])} more")
    if not (args.yes or _ask(int(seen["count"]))):
        emit(args, seen, "nothing replayed")
        return 1
    done = client.replay(selector, seen["confirmation"])
    again = f" ({done['already_replayed']} already replayed)" if done["already_replayed"] else ""
    emit(args, done, f"replayed {done['replayed']}{again}")
    return 0


def item_lines(r: dict[str, Any]) -> str:
    """An attention item on two lines: what it is, then its detail."""
    actions = ", ".join(r["actions"]) or "-"
    head = f"{r['id']:<8}{r['employee']:<16}{r['kind']:<22}{r['severity']:<9}{r['state']:<10}"
    seen = times.ago(r["last_seen"])
    return f"{head}{r['count']:<7}{seen:<10}{actions}\n        {r['detail'] or ''}"


ITEM_HEADER = (f"{'ID':<8}{'EMPLOYEE':<16}{'KIND':<22}{'SEVERITY':<9}{'STATE':<10}{'COUNT':<7}"
               f"{'LAST SEEN':<10}ACTIONS")  # fmt: skip
ITEM_WIDE = [
    Column("ID", lambda r: r["id"], 6),
    Column("EMPLOYEE", lambda r: r["employee"], 14),
    Column("KIND", lambda r: r["kind"], 20),
    Column("SEVERITY", lambda r: r["severity"], 8),
    Column("STATE", lambda r: r["state"], 8),
    Column("COUNT", lambda r: r["count"], 5),
    Column("FIRST SEEN", lambda r: times.exact(r["first_seen"]), 25),
    Column("LAST SEEN", lambda r: times.exact(r["last_seen"]), 25),
    Column("REF", lambda r: r["ref"], 12),
    Column("AUDIENCE", lambda r: r["audience"], 8),
    Column("ACTIONS", lambda r: ",".join(r["actions"]), 7),
    Column("DETAIL", lambda r: r["detail"]),
]


def _item_id(raw: str | None, action: str) -> int:
    if raw is None or not raw.isdigit():
        raise UsageError(f"attention {action} needs the item's ID (a number)")
    return int(raw)


def _act(client: OwnerClient, args: argparse.Namespace) -> dict[str, Any]:
    item_id = _item_id(args.id, "act")
    action = args.action
    if action is None:
        offered = client.attention_item(item_id)["actions"]
        if len(offered) != 1:
            choices = ", ".join(offered) or "none"
            raise CliError(f"attention item {item_id} offers: {choices}; choose with --action")
        action = offered[0]
    body: dict[str, Any] = {"action": action}
    if args.daily_usd is not None:
        body["daily_usd"] = args.daily_usd
    return client.attention_post(item_id, "act", body)


def cmd_attention(args: argparse.Namespace) -> int:
    client = owner_client(args)
    if args.verb == "act":
        done = _act(client, args)
        emit(args, done, f"attention/{done['item']}: {done['action']} taken")
        return 0
    if args.verb in ("ack", "resolve", "get"):
        item_id = _item_id(args.id, args.verb)
        if args.verb == "get":
            item = client.attention_item(item_id)
        else:
            item = client.attention_post(item_id, args.verb, {})
        emit(args, item, item_lines(item), "\n".join(table([item], ITEM_WIDE, wide=True)))
        return 0
    return _list_items(args, client)


def _list_items(args: argparse.Namespace, client: OwnerClient) -> int:
    params = {"kind": "attention", **({"employee": args.employee} if args.employee else {})}
    stream = watch.start(client, params) if args.watch else None
    query = {"state": args.state, "employee": args.employee, "kind": args.kind,
             "limit": args.limit, "cursor": args.cursor}  # fmt: skip
    page = client.attention(query)
    rows = page["attention"]
    empty = ["nothing needs attention"]
    lines = [ITEM_HEADER, *([item_lines(r) for r in rows] or empty), *_more(page)]
    wide = [*(table(rows, ITEM_WIDE, wide=True) if rows else empty), *_more(page)]
    if stream is None:
        emit(args, page, "\n".join(lines), "\n".join(wide))
        return 0
    wide_form = output.form(args) == output.WIDE
    emit_one(args, page, "\n".join(wide if wide_form else lines))  # then a JSON line each
    for event in watch.events(stream):  # the item as it is now, each time it changes
        item = client.attention_item(int(event["ref"]))
        if args.kind in (None, item["kind"]):
            text = item_lines(item)
            if wide_form:
                text = table([item], ITEM_WIDE, wide=True, header=False)[0]
            emit_one(args, item, text)
    return 0


def _pages(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, help="rows per page (1..200, default 50)")
    p.add_argument("--cursor", help="the next page (printed after a full page)")


def add_commands(add: Add) -> None:
    """Register the commands on `eventosctl`'s parser."""
    p = add("dead-letters", cmd_dead_letters, "list what the bus settled dead, newest first")
    p.add_argument("--reason", help="a reason code (filter_error, reset, turn_failed, …)")
    p.add_argument("--source", help="a source key (webhook:stripe) or its kind (webhook)")
    p.add_argument("--employee", help="only this employee's")
    p.add_argument("--since", help="ISO 8601 time with its offset")
    p.add_argument("--until", help="ISO 8601 time with its offset")
    p.add_argument("--replayed", choices=["true", "false"], help="replayed already, or not")
    _pages(p)
    p = add("replay", cmd_replay, "replay dead letters: shows what, asks, then replays")
    p.add_argument("--selector", required=True,
                   help="key=value,… with id (repeatable), reason, source, employee, since, "
                        "until; or a JSON object")  # fmt: skip
    p.add_argument("--yes", action="store_true", help="replay without asking")
    p = add("attention", cmd_attention, "list attention items, or get, ack, resolve or act on one")
    p.add_argument("verb", nargs="?", choices=["list", "get", "ack", "resolve", "act"],
                   default="list")  # fmt: skip
    p.add_argument("id", nargs="?", help="the item (get, ack, resolve, act)")
    p.add_argument("--state", help="open, acked, resolved, or several comma-separated")
    p.add_argument("--employee", help="only this employee's")
    p.add_argument("--kind", help="only this kind")
    p.add_argument("--action", help="act: the action to take (default: the item's only one)")
    p.add_argument("--daily-usd", type=float, help="act resume: raise the daily budget instead")
    p.add_argument("-w", "--watch", action="store_true",
                   help="list, then print each item again as it changes")  # fmt: skip
    _pages(p)
