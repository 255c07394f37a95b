"""Owner intents (SPEC I2): an owner action that needs Temporal commits its database change
and an intent row in one transaction and answers at once; the deliverer applies it.

Start, Stop, Resume, Reset and limit changes take the generation's next control revision;
the supervisor's Updates carry it, so a repeated or overtaken intent is recognised as stale.
Interrupt targets one conversation's entity; re-arm is instance-wide.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.employees import lifecycle
from eventos.errors import InputInvalid, NotFound

Transition = Callable[[Conn, str], Awaitable[lifecycle.GenerationRef]]
LIFECYCLE: dict[str, Transition] = {
    names.INTENT_START: lifecycle.start,
    names.INTENT_STOP: lifecycle.stop,
    names.INTENT_RESUME: lifecycle.resume,
    names.INTENT_RESET: lifecycle.reset,
}
LIMIT_KEYS = ("daily_usd",)


@dataclass(frozen=True)
class Requested:
    """What a request committed: the generation's new state and the intent that follows."""

    employee: str
    generation: int
    state: str
    intent: dict[str, Any]


def intent_view(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """An intent as the API shows it."""
    if row is None:
        return None
    return {
        "id": row["id"], "kind": row["kind"], "state": row["state"], "revision": row["revision"],
        "outcome": row["outcome"], "created_at": row["created_at"].isoformat(),
        "applied_at": row["applied_at"].isoformat() if row["applied_at"] else None,
    }  # fmt: skip


async def _insert(conn: Conn, employee: str | None, generation: int | None, kind: str,
                  revision: int | None, payload: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    cur = await conn.execute(Q["intent_insert"], {
        "employee": employee, "generation": generation, "kind": kind, "revision": revision,
        "payload": Jsonb(payload),
    })  # fmt: skip
    row = await cur.fetchone()
    assert row is not None
    return row


async def request(conn: Conn, name: str, kind: str,
                  transition: Transition | None = None) -> Requested:  # fmt: skip
    """Start, Stop, Resume or Reset: the database change and its intent, one transaction."""
    async with conn.transaction():
        ref = await (transition or LIFECYCLE[kind])(conn, name)
        cur = await conn.execute(
            Q["generation_bump_revision"], {"employee": name, "generation": ref.generation}
        )
        control = await cur.fetchone()
        assert control is not None
        payload = {"state": control["state"], "pause_reason": control["pause_reason"]}
        intent = await _insert(conn, name, ref.generation, kind,
                               int(control["control_revision"]), payload)  # fmt: skip
    return Requested(name, ref.generation, ref.state, intent)


async def pause_for_budget(conn: Conn, name: str) -> Requested:
    """The ledger reached its maximum: Stop with `pause_reason=budget` (its own intent)."""
    stop = functools.partial(lifecycle.stop, pause_reason=names.PAUSE_BUDGET)
    return await request(conn, name, names.INTENT_STOP, stop)


def checked_limits(body: dict[str, Any]) -> dict[str, Any]:
    """The limits block from a request: known keys, positive numbers."""
    unknown = sorted(set(body) - set(LIMIT_KEYS))
    if unknown:
        raise InputInvalid(unknown[0], f"unknown limit; known: {list(LIMIT_KEYS)}")
    out: dict[str, Any] = {}
    for key, value in body.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise InputInvalid(key, "must be a positive number")
        out[key] = float(value)
    if not out:
        raise InputInvalid("(body)", f"give at least one limit: {list(LIMIT_KEYS)}")
    return out


async def set_limits(conn: Conn, name: str, limits: dict[str, Any]) -> Requested:
    """Replace the live generation's limits (absolute values) and write the intent."""
    limits = checked_limits(limits)
    async with conn.transaction():
        live = await lifecycle.lock_live(conn, name)
        params = {"employee": name, "generation": live.generation, "limits": Jsonb(limits)}
        cur = await conn.execute(Q["generation_set_limits"], params)
        control = await cur.fetchone()
        assert control is not None
        intent = await _insert(conn, name, live.generation, names.INTENT_LIMITS,
                               int(control["control_revision"]), {"limits": limits})  # fmt: skip
    return Requested(name, live.generation, live.state, intent)


async def interrupt(conn: Conn, name: str, conversation: str) -> Requested:
    """The owner interrupts the running turn of one conversation (`<lane>/<thread>`)."""
    lane, _, thread = conversation.partition("/")
    if not lane or not thread:
        raise InputInvalid("conversation", "must be <lane>/<thread>, e.g. talk/main")
    async with conn.transaction():
        live = await lifecycle.lock_live(conn, name)
        params = {"employee": name, "lane": lane, "thread": thread}
        cur = await conn.execute(Q["stream_of_conversation"], params)
        stream = await cur.fetchone()
        if stream is None:
            raise NotFound(f"{name!r} has no conversation {conversation!r}")
        intent = await _insert(conn, name, live.generation, names.INTENT_INTERRUPT, None,
                               {"entity_id": stream["entity_id"],
                                "conversation": conversation})  # fmt: skip
    return Requested(name, live.generation, live.state, intent)


async def rearm(conn: Conn) -> dict[str, Any]:
    """Ask the deliverer to re-arm Temporal from the database (instance-wide)."""
    return await _insert(conn, None, None, names.INTENT_REARM, None, {})


async def get(conn: Conn, intent_id: int) -> dict[str, Any]:
    cur = await conn.execute(Q["intent_get"], {"id": intent_id})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no intent {intent_id}")
    return row
