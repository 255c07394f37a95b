"""`eventosctl chat` and `users` (docs/cli.md)."""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from eventos import names
from eventos.cli.instance import CliError, UsageError, owner_client
from eventos.cli.output import Column, emit, table, time_columns
from eventos.client.owner_api import OwnerClient

WAIT_POLL_S = 0.2
EXIT_HELD = 7  # `chat --wait`: held for approval (docs/cli.md#exit-codes)
HELD = "held for approval"
GATE_APPROVAL = "approval"  # the gate code (eventos.timeline.gates.APPROVAL)
FATES = {names.REPLY_DECLINED: "was declined", names.REPLY_EXPIRED: "expired undecided",
         names.REPLY_FAILED: "failed to send"}  # fmt: skip
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
    if not args.wait:
        return 0
    found = wait_for_reply(owner_client(args), args.name, int(queued["message_id"]), args.timeout)
    if found.get("reply") is not None:
        emit(args, {"reply": found["reply"]}, str(found["reply"]))
        return 0
    emit(args, found, f"message {found['message_id']} {HELD}: {_held_words(found)}")
    return EXIT_HELD


def _gate(found: dict[str, Any]) -> dict[str, Any]:
    return found.get("gate") or {}


def _held_words(found: dict[str, Any]) -> str:
    """Which approval it waits for (the admin reads the gate; a user, only that its reply is
    held for review)."""
    return str(_gate(found).get("text") or "its reply is held for review")


def _settled(found: dict[str, Any]) -> bool:
    """Answered with its reply, or waiting for an approval: what --wait reports; raises
    CliError for a message that will have no reply (dead, its reply declined or expired)."""
    if found.get("reply") is not None:
        return True
    fate, ident = found.get("reply_status"), found["message_id"]
    if fate == names.REPLY_HELD or _gate(found).get("code") == GATE_APPROVAL:
        return True
    if fate in (names.REPLY_DECLINED, names.REPLY_EXPIRED, names.REPLY_FAILED):
        raise CliError(f"message {ident} was answered, but its reply {FATES[fate]}: not sent")
    if found["status"] == "dead":
        why = f" ({found['reason']})" if found.get("reason") else ""
        raise CliError(f"message {ident} is dead{why}: no turn will answer it")
    return False


def wait_for_reply(client: OwnerClient, name: str, message_id: int,
                   timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """Poll the message until its reply is there or it waits for an approval (the message's
    answer); CliError when it will have no reply, or at the deadline with what holds it."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = client.message(name, message_id)
        if _settled(found):
            return found
        if time.monotonic() > deadline:
            gate = _gate(found)
            why = f"; it waits at {gate['code']}: {gate['text']}" if gate else ""
            raise CliError(f"no reply within {timeout_s:g}s: message {message_id} is "
                           f"{found['status']}{why}")  # fmt: skip
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
