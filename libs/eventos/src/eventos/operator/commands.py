"""`eventosctl dead-letters`, `replay` and `attention` (SPEC §17 CLI; docs/cli.md).

`replay` asks first: without `--yes` it prints what the selector would replay and asks on the
terminal (anything but `y` replays nothing, exit 1); with `--yes` it confirms with the token the
instance gave. Exit codes as every command: 0 done, 1 refused, declined or failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from eventos.cli import CliError, emit, owner_client
from eventos.owner_client import OwnerClient

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
            raise CliError(f"--selector is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise CliError("--selector must be a JSON object")
        return doc
    selector: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in SELECTOR_KEYS or not value:
            raise CliError(f"--selector: {part!r} is not one of {'=…, '.join(SELECTOR_KEYS)}=…")
        if key == "id":
            selector.setdefault("ids", []).append(value)
        else:
            selector[key] = value
    if not selector:
        raise CliError("--selector names nothing; e.g. --selector reason=filter_error")
    return selector


def _letter_line(r: dict[str, Any]) -> str:
    replayed = f"replayed as ingress-{r['replayed_as']}" if r["replayed_as"] else "-"
    return (f"{r['id']:<18}{r['reason']:<18}{r['at'][:19]:<21}{r['source']:<28}"
            f"{r['employee'] or '-':<16}{replayed}\n    {r['preview']}")  # fmt: skip


def cmd_dead_letters(args: argparse.Namespace) -> int:
    query = {"reason": args.reason, "source": args.source, "employee": args.employee,
             "since": args.since, "until": args.until, "replayed": args.replayed,
             "limit": args.limit, "cursor": args.cursor}  # fmt: skip
    page = owner_client(args).dead_letters(query)
    rows = page["dead_letters"]
    lines = [f"{'ID':<18}{'REASON':<18}{'AT':<21}{'SOURCE':<28}{'EMPLOYEE':<16}REPLAYED"]
    lines += [_letter_line(r) for r in rows] or ["no dead letters"]
    if page["next_cursor"]:
        lines.append(f"more: --cursor {page['next_cursor']}")
    emit(args, page, "\n".join(lines))
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
    if not getattr(args, "json", False):
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


def _item_lines(r: dict[str, Any]) -> str:
    actions = ", ".join(r["actions"]) or "-"
    head = f"{r['id']:<8}{r['employee']:<16}{r['kind']:<22}{r['severity']:<9}{r['state']:<10}"
    return f"{head}{r['count']:<7}{r['last_seen'][:19]:<21}{actions}\n        {r['detail'] or ''}"


def _item_id(raw: str | None, action: str) -> int:
    if raw is None or not raw.isdigit():
        raise CliError(f"attention {action} needs the item's ID (a number)")
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
        emit(args, item, _item_lines(item))
        return 0
    query = {"state": args.state, "employee": args.employee, "kind": args.kind,
             "limit": args.limit, "cursor": args.cursor}  # fmt: skip
    page = client.attention(query)
    lines = [f"{'ID':<8}{'EMPLOYEE':<16}{'KIND':<22}{'SEVERITY':<9}{'STATE':<10}{'COUNT':<7}"
             f"{'LAST SEEN':<21}ACTIONS"]  # fmt: skip
    lines += [_item_lines(r) for r in page["attention"]] or ["nothing needs attention"]
    if page["next_cursor"]:
        lines.append(f"more: --cursor {page['next_cursor']}")
    emit(args, page, "\n".join(lines))
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
    _pages(p)
