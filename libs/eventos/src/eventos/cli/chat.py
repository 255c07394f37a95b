"""`eventosctl chat` and `users` (docs/cli.md)."""

from __future__ import annotations

import argparse
import time
import uuid

from eventos.cli.instance import CliError, UsageError, owner_client
from eventos.cli.output import Column, emit, table, time_columns
from eventos.client.owner_api import OwnerClient

WAIT_POLL_S = 0.2
USER_COLUMNS = [
    Column("NAME", lambda r: r["name"], 4),
    Column("CLASS", lambda r: r.get("class")),
    Column("DAILY_USD", lambda r: "share" if r.get("daily_usd") is None else r["daily_usd"]),
    *time_columns("CREATED", lambda r: r["created_at"]),
]


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
            held = " and its reply is held for review" if found.get("reply_status") else ""
            raise CliError(
                f"no reply within {timeout_s:g}s (message {message_id} is {found['status']}{held})"
            )
        time.sleep(WAIT_POLL_S)


def cmd_users(args: argparse.Namespace) -> int:
    client = owner_client(args)
    if args.action != "list" and not args.name:
        raise UsageError(f"users {args.action} needs a NAME")
    if args.action == "add":
        created = client.user_add(args.name, args.klass, args.daily_usd)
        emit(args, created, f"user/{created['name']} created; its token (shown once):\n"
                            f"{created['token']}")  # fmt: skip
    elif args.action == "remove":
        client.user_remove(args.name)
        emit(args, {"removed": args.name}, f"user/{args.name} removed")
    else:
        rows = client.users()
        text, wide = ("\n".join(table(rows, USER_COLUMNS, wide=w)) for w in (False, True))
        emit(args, rows, text if rows else "no users", wide if rows else "no users")
    return 0
