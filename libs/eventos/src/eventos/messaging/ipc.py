"""Employee messaging on the bus (SPEC §10): the inbox records of messages, tasks and task
results, and what a task's deadline does when it is due.

A message or a task goes to source `ipc:<target>` (the target's implicit subscription, C3),
placed in thread `peer_<sender>_<origin>` of the worker lane with no reply route: one thread of
the target per conversation of the sender that wrote (`names.peer_thread`), so the target's
history for one of the sender's customers never holds another's (EG17). A task result goes to
`ipc:<delegator>` placed in the task's `reply_to` (the delegating turn's thread, lane and
route), so the delegator's next turn continues that conversation and its reply goes where
that thread's replies go. A task's deadline is an alarm of kind `deadline` (ref `task:<id>`)
of the delegating generation: its supervisor's one timer fires it, and `fire_due` calls
`task_deadline_due` in its transaction (alarms.store.DEADLINE_HOOKS).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eventos import names
from eventos.bus.envelope import encoded_size
from eventos.bus.inbox import IngressRecord
from eventos.db import Conn
from eventos.db.sql import Q

TASK_REF_PREFIX = "task:"  # the ref of a task's deadline alarm


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


def peer_wake(sender: str, origin_lane: str, origin_thread: str, target: str, chain_id: str,
              hop: int, path: list[str]) -> Wake:  # fmt: skip
    """A message or task from the sender's conversation (origin_lane, origin_thread): its own
    thread of the target's worker lane (`names.peer_thread`), no reply route."""
    route = {"kind": names.IPC_ROUTE_KIND, "reply": False, "from": sender}
    thread = names.peer_thread(sender, origin_lane, origin_thread)
    return Wake(target, names.LANE_WORKER, thread, route, chain_id, hop, path, sender)


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


def deadline_ref(task_id: str) -> str:
    """The ref of a task's deadline alarm (cancelled by `complete_task`)."""
    return TASK_REF_PREFIX + task_id


async def task_deadline_due(conn: Conn, alarm: dict[str, Any]) -> IngressRecord | None:
    """A task's deadline alarm is due (in `fire_due`'s transaction): an open task moves to
    `timed_out` by compare-and-swap and the delegator's notice is the input to append; a task
    settled meanwhile (done, cancelled) gives None, so nothing is delivered."""
    cur = await conn.execute(Q["ipc_task_time_out"], {
        "id": str(alarm["ref"]).removeprefix(TASK_REF_PREFIX), "employee": alarm["employee"],
        "now": alarm["now"],
    })  # fmt: skip
    task = await cur.fetchone()
    return timed_out_record(dict(task)) if task is not None else None


async def cancel_cut_task(conn: Conn, row: dict[str, Any], reason: str, now: datetime) -> None:
    """The router cut a task's wake as a loop: the task is `cancelled` with the reason and its
    deadline with it (the delegator is not woken about it; a wake would feed the same loop;
    the dead row and the attention item tell the operator)."""
    env: dict[str, Any] = row["envelope"] if isinstance(row["envelope"], dict) else {}
    data: dict[str, Any] = env["data"] if isinstance(env.get("data"), dict) else {}
    if row["type"] != names.TYPE_IPC_TASK or not isinstance(data.get("task_id"), str):
        return
    cur = await conn.execute(Q["ipc_task_cancel"], {"id": data["task_id"], "reason": reason,
                                                    "now": now})  # fmt: skip
    task = await cur.fetchone()
    if task is not None:  # the alarms' own query (alarms.cancel_by_ref imports this module)
        await conn.execute(Q["alarms_cancel_by_ref"], {
            "employee": task["from_employee"], "kind": names.DEADLINE_KIND,
            "ref": deadline_ref(data["task_id"]),
        })  # fmt: skip
