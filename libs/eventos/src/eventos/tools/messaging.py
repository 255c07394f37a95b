"""Tools of the messaging family (SPEC §10, §17): `send_to_employee {to, text}`,
`delegate_to_employee {to, task, deadline_s?}` and `complete_task {task_id?, result}`.

Each runs in the transaction that records the call (idempotent per turn and tool call): the
`ipc_tasks` row, the inbox append and a task's deadline (an alarm of the delegating generation,
ref `task:<id>`, fired by its supervisor's timer) commit together, in the sender's transaction;
the tool activity then signals that supervisor (SIGNALS_SUPERVISOR). A message or task lands in
the target's thread for the calling conversation (`names.peer_thread`); only a turn of that
thread completes a task (its result returns to the delegating conversation alone). Names
resolve within the instance; the target must be running; nobody messages itself. Every wake
carries the turn's chain, hop + 1 and path + [sender] (I8); the router's storm guards decide
whether it is delivered, collected into a digest, or cut as a loop. Bounds (SPEC §15): 200 open
tasks per delegator, 500 pending ipc inputs per target; past them the call is refused.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from eventos import names
from eventos.alarms import store as alarms
from eventos.bus.inbox import append
from eventos.db.sql import Q
from eventos.messaging import ipc
from eventos.tools.base import Effect, Tool, ToolContext, ToolRefused, obj

TEXT = {"type": "string", "minLength": 1, "maxLength": names.IPC_TEXT_MAX}
TO = {"type": "string", "minLength": 1, "maxLength": 64, "description": "employee name"}


def event_id(kind: str, ctx: ToolContext) -> str:
    """A stable id from (turn, tool call): a retried attempt names the same message or task."""
    return f"{kind}_" + hashlib.sha256(ctx.call.key.encode()).hexdigest()[:16]


def next_path(ctx: ToolContext) -> list[str]:
    """The turn's path with the sender last (the newest employees kept, I8)."""
    me = ctx.call.employee
    return [*[p for p in ctx.call.path if p != me], me][-names.STORM_PATH_MAX :]


async def peer(ctx: ToolContext, to: str) -> str:
    """Another running employee of this instance, with room in its inbox (ToolRefused)."""
    if to == ctx.call.employee:
        raise ToolRefused("an employee cannot message itself")
    cur = await ctx.conn.execute(Q["ipc_peer_running"], {"employee": to})
    row = await cur.fetchone()
    if row is None:
        raise ToolRefused(f"no employee named {to!r} in this instance")
    if row["state"] != names.GEN_RUNNING:
        raise ToolRefused(f"employee {to!r} is not running ({row['state']})")
    source = names.source_key(names.SOURCE_IPC, to)
    cur = await ctx.conn.execute(Q["ipc_pending_for_target"], {"source_key": source})
    pending = int((await cur.fetchone() or {})["pending"])
    if pending >= names.IPC_PENDING_MAX:
        raise ToolRefused(f"employee {to!r} has {pending} messages and tasks waiting (at most "
                          f"{names.IPC_PENDING_MAX}); try again later")  # fmt: skip
    return to


async def send_to_employee(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    to = await peer(ctx, str(args["to"]))
    me, mid = ctx.call.employee, event_id("msg", ctx)
    wake = ipc.peer_wake(me, ctx.call.lane, ctx.call.thread, to, ctx.call.chain_id,
                         ctx.call.hop + 1, next_path(ctx))  # fmt: skip
    # Where the sender is told if it expires undelivered (SPEC §15): the sending conversation.
    origin = {"lane": ctx.call.lane, "thread": ctx.call.thread, "route": ctx.call.route}
    data = {"text": f"[message {mid} from {me}]\n{args['text']}", "from": me, "message_id": mid,
            "origin": origin}  # fmt: skip
    await append(ctx.conn, [ipc.record(wake, names.TYPE_IPC_MESSAGE, mid, data)])
    return {"message_id": mid}


async def delegate_to_employee(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    to = await peer(ctx, str(args["to"]))
    me, call = ctx.call.employee, ctx.call
    cur = await ctx.conn.execute(Q["ipc_open_tasks_of"], {"employee": me})
    if int((await cur.fetchone() or {})["open"]) >= names.IPC_OPEN_TASKS_MAX:
        raise ToolRefused(f"{names.IPC_OPEN_TASKS_MAX} delegated tasks are still open; wait "
                          "for results before delegating more")  # fmt: skip
    task_id = event_id("task", ctx)
    deadline = args.get("deadline_s")
    deadline_at = ctx.now + timedelta(seconds=int(deadline)) if deadline else None
    reply_to = {"thread": call.thread, "lane": call.lane, "route": call.route}
    wake = ipc.peer_wake(me, call.lane, call.thread, to, call.chain_id, call.hop + 1,
                         next_path(ctx))  # fmt: skip
    await ctx.conn.execute(Q["ipc_task_insert"], {
        "id": task_id, "from_employee": me, "from_generation": call.generation,
        "to_employee": to, "task": args["task"], "reply_to": Jsonb(reply_to),
        "chain_id": call.chain_id, "hop": call.hop + 1, "path": Jsonb(call.path),
        "deadline_at": deadline_at, "now": ctx.now, "to_thread": wake.thread,
    })  # fmt: skip
    if deadline_at is not None:
        await alarms.create_deadline(
            ctx.conn, employee=me, generation=call.generation, ref=ipc.deadline_ref(task_id),
            due_at=deadline_at, lane=call.lane, thread=call.thread, route=call.route,
            agent=call.agent, text=f"task {task_id} for {to} is due", chain_id=call.chain_id,
            hop=call.hop + 1, path=call.path, payload={"task_id": task_id, "to": to},
        )  # fmt: skip
    due = f", due {deadline_at.isoformat()}" if deadline_at else ""
    data = {"text": f"[task {task_id} from {me}{due}; finish it with complete_task]\n"
                    f"{args['task']}", "task_id": task_id, "from": me}  # fmt: skip
    await append(ctx.conn, [ipc.record(wake, names.TYPE_IPC_TASK, task_id, data)])
    return {"task_id": task_id, "status": names.TASK_OPEN}


def default_task(ctx: ToolContext, args: dict[str, Any]) -> str:
    """The task named, else the one whose input woke this turn (the newest of them)."""
    if args.get("task_id"):
        return str(args["task_id"])
    if not ctx.call.woken_tasks:
        raise ToolRefused("no task woke this turn: give task_id")
    return ctx.call.woken_tasks[-1]


async def complete_task(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Only a turn of the thread the task landed in completes it: the result carries that
    conversation's work back to the delegating one, never another conversation's (EG17). A
    task of another thread of this employee is answered as one that does not exist."""
    task_id, me, call = default_task(ctx, args), ctx.call.employee, ctx.call
    thread = call.thread if call.lane == names.LANE_WORKER else ""  # tasks land in the worker lane
    cur = await ctx.conn.execute(Q["ipc_task_complete"], {
        "id": task_id, "employee": me, "thread": thread, "result": args["result"],
        "now": ctx.now,
    })  # fmt: skip
    task = await cur.fetchone()
    if task is None:
        cur = await ctx.conn.execute(Q["ipc_task_get"], {"id": task_id})
        found = await cur.fetchone()
        if found is None or (found["to_employee"] == me and found["to_thread"] != thread):
            raise ToolRefused(f"no task {task_id!r}")
        if found["to_employee"] != me:
            raise ToolRefused(f"task {task_id} is {found['to_employee']}'s: only the assignee "
                              "completes it")  # fmt: skip
        raise ToolRefused(f"task {task_id} is already {found['status']}")
    await alarms.cancel_by_ref(ctx.conn, str(task["from_employee"]), ipc.deadline_ref(task_id))
    text = f"[result of task {task_id} from {me}]\n{args['result']}"
    data = {"text": text, "task_id": task_id, "status": names.TASK_DONE, "from": me}
    # The result returns to the delegating turn: its hop goes on, its path is restored (the
    # delegation returns like a call), so a ping-pong of delegations is cut by hops (I8).
    wake = ipc.reply_wake(dict(task), ctx.call.hop + 1, me)
    await append(ctx.conn, [ipc.record(wake, names.TYPE_IPC_RESULT, f"result_{task_id}", data)])
    return {"task_id": task_id, "status": names.TASK_DONE}


TOOLS: list[Tool] = [
    Tool("send_to_employee",
         "Send a message to another employee of this instance (it arrives in their thread "
         "for you; they answer with their own tools).",
         obj({"to": TO, "text": TEXT}, ["to", "text"]), send_to_employee,
         Effect.IDEMPOTENT, transactional=True),
    Tool("delegate_to_employee",
         "Give another employee a task; its result (or a timeout after deadline_s) comes back "
         "into this conversation. Returns the task id.",
         obj({"to": TO, "task": TEXT, "deadline_s": {"type": "integer", "minimum": 1,
                                                     "maximum": names.IPC_DEADLINE_MAX_S}},
             ["to", "task"]), delegate_to_employee, Effect.IDEMPOTENT, transactional=True),
    Tool("complete_task",
         "Finish a task another employee gave you in this conversation with its result "
         "(task_id defaults to the task that woke you).",
         obj({"task_id": {"type": "string", "maxLength": 64}, "result": TEXT}, ["result"]),
         complete_task, Effect.IDEMPOTENT, transactional=True),
]  # fmt: skip
