"""Staleness of messaging between employees (SPEC §15: 24 h, then `expired`).

A message or task that waited undelivered past the bound — its target paused, held by its
budget or degraded — is `expired` with the reason, and its sender is told in the same
transaction: a message by a notice (`eventos.ipc.message.expired`) in the conversation that
sent it, a task by moving it to `expired` (its deadline cancelled) and a notice
(`eventos.ipc.task.expired`) in the delegating conversation, where its result would have come.
The router's messaging upkeep runs `expire_undelivered` every few seconds.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from eventos import names
from eventos.bus.inbox import IngressRecord, append
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.messaging import ipc

QUOTE_MAX = 500  # characters of the expired message quoted back to its sender


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:g} h" if hours >= 1 else f"{seconds:g} s"


def _data(row: dict[str, Any]) -> dict[str, Any]:
    env = row["payload"] if isinstance(row["payload"], dict) else {}
    data = env.get("data")
    return data if isinstance(data, dict) else {}


def _path(row: dict[str, Any]) -> list[str]:
    env = row["payload"] if isinstance(row["payload"], dict) else {}
    path = env.get(names.ATTR_PATH)
    return [str(p) for p in path] if isinstance(path, list) else []


def message_notice(row: dict[str, Any], waited: str) -> IngressRecord | None:
    """The sender's notice that its message expired, in the conversation that sent it (its
    `origin`; a message from before origins were kept: the sender's worker `main`)."""
    data = _data(row)
    sender, mid = data.get("from"), data.get("message_id")
    if not isinstance(sender, str) or not isinstance(mid, str):
        return None
    found = data.get("origin")
    origin: dict[str, Any] = found if isinstance(found, dict) else {}
    lane = str(origin.get("lane") or names.LANE_WORKER)
    thread = str(origin.get("thread") or "main")
    route = origin.get("route")
    wake = ipc.Wake(sender, lane, thread, dict(route) if isinstance(route, dict) else {},
                    str(row["chain_id"]), int(row["hop"]), _path(row))  # fmt: skip
    quoted = str(data.get("text") or "").split("\n", 1)[-1][:QUOTE_MAX]
    text = (f"[message {mid} to {row['target']} expired undelivered after {waited}; "
            f"{row['target']} did not take it in time]\n{quoted}")  # fmt: skip
    notice = {"text": text, "message_id": mid, "status": names.TASK_EXPIRED,
              "to": row["target"]}  # fmt: skip
    return ipc.record(wake, names.TYPE_IPC_MESSAGE_EXPIRED, f"expired:{mid}", notice)


async def task_notice(conn: Conn, row: dict[str, Any], reason: str,
                      now: datetime) -> IngressRecord | None:  # fmt: skip
    """An open task whose wake expired becomes `expired` (its deadline cancelled); the
    delegator's notice comes where its result would have (None: the task was settled)."""
    task_id = _data(row).get("task_id")
    if not isinstance(task_id, str):
        return None
    cur = await conn.execute(Q["ipc_task_expire"], {"id": task_id, "reason": reason, "now": now})
    task = await cur.fetchone()
    if task is None:
        return None
    await conn.execute(Q["alarms_cancel_by_ref"], {
        "employee": task["from_employee"], "kind": names.DEADLINE_KIND,
        "ref": ipc.deadline_ref(task_id),
    })  # fmt: skip
    text = f"[task {task_id} for {task['to_employee']} expired: {reason}; no result will come]"
    data = {"text": text, "task_id": task_id, "status": names.TASK_EXPIRED,
            "to": task["to_employee"]}  # fmt: skip
    wake = ipc.reply_wake(dict(task), int(task["hop"]), None)  # the platform's notice
    return ipc.record(wake, names.TYPE_IPC_TASK_EXPIRED, f"expired:{task_id}", data)


async def expire_undelivered(conn: Conn, now: datetime, stale_after_s: float,
                             limit: int = names.IPC_EXPIRE_BATCH) -> int:  # fmt: skip
    """One pass: messages and tasks undelivered for `stale_after_s` expire, their senders
    told, in one transaction; how many expired."""
    waited = _hours(stale_after_s)
    reason = f"stale: undelivered for {waited}"
    async with conn.transaction():
        cur = await conn.execute(Q["ipc_undelivered_expire"], {
            "before": now - timedelta(seconds=stale_after_s), "limit": limit, "reason": reason,
        })  # fmt: skip
        rows = await cur.fetchall()
        notices: list[IngressRecord] = []
        for row in rows:
            if row["type"] == names.TYPE_IPC_TASK:
                notice = await task_notice(conn, row, f"undelivered for {waited}", now)
            else:
                notice = message_notice(row, waited)
            if notice is not None:
                notices.append(notice)
        if notices:
            await append(conn, notices)
    return len(rows)
