"""The actions attention items offer (`POST /v1/attention/{id}:act`), by item kind.

`ACTIONS` maps a kind to its actions by name; a new kind's action is one line there. An action
runs inside the transaction that holds its item locked, and says what the answer shows. One
that `resolves` settles its item as it is taken; any other leaves the item until its cause goes
away (a parked turn granted a slot again, a budget below its maximum). An `admin_only` action
changes the employee as a whole; the others act on the item's own content, so the user whose
audience the item is in may take them too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.employees import intents, lifecycle
from eventos.employees.lifecycle import GenerationRef
from eventos.errors import Conflict
from eventos.health import actions as health
from eventos.operator import dead_letters, replay
from eventos.outbox import egress
from eventos.tools import retry

Item = dict[str, Any]
Run = Callable[[Conn, Item, dict[str, Any]], Awaitable[dict[str, Any]]]
Lock = Callable[[Conn, Item], Awaitable[None]]


@dataclass(frozen=True)
class Action:
    """What taking an action runs, who may take it, and whether it settles the item."""

    run: Run
    admin_only: bool = False
    resolves: bool = False
    lock_first: Lock | None = None  # what must be locked before the item (a pass's order)


async def _resume_or_release(conn: Conn, name: str) -> GenerationRef:
    """A paused generation runs again; a running one is set running once more, which makes
    its supervisor release the parked and suspended turns (SPEC §9: Resume releases a park)."""
    live = await lifecycle.lock_live(conn, name)
    if live.state == names.GEN_PAUSED:
        return await lifecycle.resume(conn, name)
    if live.state != names.GEN_RUNNING:
        raise Conflict(f"{name!r} generation {live.generation} is {live.state}; start it first")
    return live


async def resume(conn: Conn, item: Item, body: dict[str, Any]) -> dict[str, Any]:
    """Resume the employee (its intent); with `daily_usd` raise the limit instead, which
    resumes an employee its full budget paused (a plain Resume meets the same full budget:
    its turns then wait for the period's end)."""
    employee = str(item["employee"])
    if body.get("daily_usd") is not None:
        req = await intents.set_limits(conn, employee, {"daily_usd": body["daily_usd"]})
    else:
        req = await intents.request(conn, employee, names.INTENT_RESUME, _resume_or_release)
    return {"intent": intents.intent_view(req.intent)}


async def reset(conn: Conn, item: Item, body: dict[str, Any]) -> dict[str, Any]:
    """Reset the generation the item names (`emp-<employee>-g<generation>`), if still live."""
    employee, generation = str(item["employee"]), int(str(item["ref"]).rpartition("-g")[2])

    async def retire(c: Conn, name: str) -> GenerationRef:
        live = await lifecycle.lock_live(c, name)
        if live.generation != generation:
            raise Conflict(f"generation {generation} of {name!r} is no longer live")
        return await lifecycle.reset(c, name)

    req = await intents.request(conn, employee, names.INTENT_RESET, retire)
    return {"intent": intents.intent_view(req.intent)}


async def replay_inputs(conn: Conn, item: Item, body: dict[str, Any]) -> dict[str, Any]:
    """Replay the dead inputs the item names (`<stream>#<first seq>-<last seq>`), without a
    confirmation: the item names exactly one set."""
    stream, _, seqs = str(item["ref"]).rpartition("#")
    first, _, last = seqs.partition("-")
    params = {"stream_key": stream, "first": int(first), "last": int(last or first)}
    cur = await conn.execute(Q["replay_dead_inputs"], params)
    letters = [dead_letters.letter_id(names.LETTER_DELIVERY, int(r["id"]))
               for r in await cur.fetchall()]  # fmt: skip
    done = await replay.replay_letters(conn, letters)
    replays = [{"id": letter, "as": new} for letter, new in done.replays]
    return {"replayed": len(replays), "replays": replays}


async def retry_call(conn: Conn, item: Item, body: dict[str, Any]) -> dict[str, Any]:
    """Run an `unknown` tool call once more (its thread gets an input asking for it)."""
    done = await retry.request_retry(conn, item)
    return {"call": done.call, "input": done.ingress_id}


async def retry_send(conn: Conn, item: Item, body: dict[str, Any]) -> dict[str, Any]:
    """Send an `unknown`, `failed` or channel-held outbox row once more."""
    return {"outbox": await egress.retry_item(conn, item)}


RETRY_SEND = Action(retry_send, resolves=True)
ACTIONS: dict[str, dict[str, Action]] = {
    names.ATTENTION_BUDGET_MAX: {names.ACTION_RESUME: Action(resume, admin_only=True)},
    names.ATTENTION_PARKED_TURN: {names.ACTION_RESUME: Action(resume, admin_only=True)},
    names.ATTENTION_SUPERVISOR_LOST: {
        names.ACTION_RESET: Action(reset, admin_only=True, resolves=True)
    },
    names.ATTENTION_NEEDS_RESET: {
        names.ACTION_RESET: Action(reset, admin_only=True, resolves=True)
    },
    names.ATTENTION_DEAD_INPUT: {names.ACTION_REPLAY: Action(replay_inputs, resolves=True)},
    names.ATTENTION_TOOL_UNKNOWN: {names.ACTION_RETRY: Action(retry_call, resolves=True)},
    names.ATTENTION_SEND_UNKNOWN: {names.ACTION_RETRY: RETRY_SEND},
    names.ATTENTION_SEND_FAILED: {names.ACTION_RETRY: RETRY_SEND},
    names.ATTENTION_SEND_HELD: {names.ACTION_RETRY: RETRY_SEND},
    names.ATTENTION_THREAD_QUARANTINED: {
        names.ACTION_RELEASE: Action(
            health.release_thread, resolves=True, lock_first=health.lock_thread
        )
    },
    names.ATTENTION_EMPLOYEE_DEGRADED: {
        names.ACTION_CLEAR: Action(
            health.clear_degraded, admin_only=True, resolves=True, lock_first=health.lock_employee
        )
    },
}
NAMES = sorted({name for offered in ACTIONS.values() for name in offered})


def offered(kind: str, admin: bool) -> dict[str, Action]:
    """The actions an item of this kind offers a caller (the admin, or the item's user)."""
    return {name: a for name, a in ACTIONS.get(kind, {}).items() if admin or not a.admin_only}
