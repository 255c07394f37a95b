"""Employee messaging on the bus (SPEC §10): the inbox records of messages, tasks and task
results, and the deadline check.

A message or a task goes to source `ipc:<target>` (the target's implicit subscription, C3),
placed in thread `peer_<sender>` of the worker lane with no reply route; a task result goes to
`ipc:<delegator>` placed in the task's `reply_to` (the delegating turn's thread, lane and
route), so the delegator's next turn continues that conversation and its reply goes where
that thread's replies go. `expire_due` is the deadline check: the router's upkeep calls it
every few seconds (the supervisor's alarm timer may call it later instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eventos import names, storm
from eventos.bus import IngressRecord, append
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.envelope import encoded_size

EXPIRE_BATCH = 100


@dataclass(frozen=True)
class Wake:
    """Where an internal wake goes and its causal context (I8)."""

    target: str
    lane: str
    thread: str
    route: dict[str, Any]
    chain_id: str
    hop: int
    path: list[str] = field(default_factory=list)
    sender: str | None = None


def peer_wake(sender: str, target: str, chain_id: str, hop: int, path: list[str]) -> Wake:
    """A message or task: thread `peer_<sender>` of the target's worker lane, no reply route."""
    route = {"kind": names.IPC_ROUTE_KIND, "reply": False, "from": sender}
    return Wake(target, names.LANE_WORKER, names.PEER_THREAD_PREFIX + sender, route, chain_id,
                hop, path, sender)  # fmt: skip


def reply_wake(task: dict[str, Any], hop: int, sender: str | None) -> Wake:
    """A task's result or timeout: the delegating turn's thread, lane and route."""
    reply_to = task["reply_to"]
    return Wake(str(task["from_employee"]), str(reply_to["lane"]), str(reply_to["thread"]),
                dict(reply_to["route"]), str(task["chain_id"]), hop, list(task["path"] or []),
                sender)  # fmt: skip


def record(wake: Wake, event_type: str, event_id: str, data: dict[str, Any]) -> IngressRecord:
    """The ingress record of one wake, named `event_id` (its dedupe key)."""
    envelope: dict[str, Any] = {
        "specversion": "1.0", "id": event_id, "type": event_type,
        "source": f"/employees/{wake.sender or 'eventos'}", "datacontenttype": "application/json",
        "data": data, names.ATTR_LANE: wake.lane, names.ATTR_THREAD: wake.thread,
        names.ATTR_ROUTE: wake.route, names.ATTR_PATH: wake.path[-names.STORM_PATH_MAX :],
    }  # fmt: skip
    if wake.sender is not None:
        envelope[names.ATTR_SENDER] = wake.sender
    return IngressRecord(
        source_key=names.source_key(names.SOURCE_IPC, wake.target), dedupe_key=event_id,
        type=event_type, chain_id=wake.chain_id, envelope=envelope,
        size=encoded_size(envelope), klass=names.C3_INTERNAL, hop=wake.hop,
        causation_id=event_id,
    )  # fmt: skip


def timed_out_record(task: dict[str, Any]) -> IngressRecord:
    """The delegator's notice that a task's deadline passed without a result."""
    text = (f"[task {task['id']} for {task['to_employee']} timed out at "
            f"{task['deadline_at'].isoformat()}; no result came]")  # fmt: skip
    data = {"text": text, "task_id": task["id"], "status": names.TASK_TIMED_OUT,
            "to": task["to_employee"]}  # fmt: skip
    wake = reply_wake(task, int(task["hop"]), None)  # the platform's notice, not a new hop
    return record(wake, names.TYPE_IPC_TIMED_OUT, f"timed_out:{task['id']}", data)


async def expire_due(conn: Conn, now: datetime, limit: int = EXPIRE_BATCH) -> int:
    """Move open tasks past their deadline to `timed_out` and tell each delegator, in one
    transaction (compare-and-swap: a result that won the race is left alone)."""
    async with conn.transaction():
        cur = await conn.execute(Q["ipc_tasks_expire"], {"now": now, "limit": limit})
        tasks = [dict(r) for r in await cur.fetchall()]
        await append(conn, [timed_out_record(t) for t in tasks])
    return len(tasks)


async def cancel_cut_task(conn: Conn, row: dict[str, Any], reason: str, now: datetime) -> None:
    """The router cut a task's wake as a loop: the task is `cancelled` with the reason (the
    delegator is not woken about it; a wake would feed the same loop; the dead row and the
    attention item tell the operator)."""
    env: dict[str, Any] = row["envelope"] if isinstance(row["envelope"], dict) else {}
    data: dict[str, Any] = env["data"] if isinstance(env.get("data"), dict) else {}
    if row["type"] == names.TYPE_IPC_TASK and isinstance(data.get("task_id"), str):
        await conn.execute(Q["ipc_task_cancel"], {"id": data["task_id"], "reason": reason,
                                                  "now": now})  # fmt: skip


async def upkeep(conn: Conn, now: datetime) -> tuple[int, int]:
    """The router's periodic messaging work: deadlines, then due digests."""
    return await expire_due(conn, now), await storm.flush_due(conn, now)
