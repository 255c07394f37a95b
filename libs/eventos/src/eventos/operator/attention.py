"""Attention items (SPEC §12): what someone should look at, listed, acknowledged, resolved,
and acted on (the item's own action: Resume, Reset, Replay, Retry; `actions.py`).

An item is `open` when raised; `acked` once someone said they are on it: it stays listed, and a
repeat of its kind and ref counts on it (`count`, `last_seen`) without opening it again;
`resolved` when its cause went away, its action settled it, or someone resolved it by hand. A
raise after that opens a new item. The admin sees and handles every item; a user only the
items of their own audience (about their chat), and never an action that changes the employee
as a whole. An item of another audience is "not found", as if it did not exist.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict, InputInvalid, NotFound
from eventos.operator import actions
from eventos.operator.pages import decode_cursor, encode_cursor

FIELDS = ("id", "employee", "kind", "severity", "ref", "detail", "first_seen", "last_seen",
          "count", "state", "audience", "acked_at", "acked_by", "resolved_at",
          "resolved_by", "turn_id")  # fmt: skip


class Caller(Protocol):
    """Who calls: their audience, whether they are the admin, and for a user when its record
    was made (it sees nothing older: a re-created name is a new user)."""

    @property
    def audience(self) -> str: ...

    @property
    def admin(self) -> bool: ...

    @property
    def since(self) -> datetime | None: ...


def _mine(row: dict[str, Any], caller: Caller) -> bool:
    """The admin sees every item; a user those of its audience raised since its record."""
    if caller.admin:
        return True
    since = caller.since
    return row["audience"] == caller.audience and (since is None or row["first_seen"] >= since)


def view(row: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """An item as the API shows it, with the actions this caller may take on it."""
    out = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()
           if k in FIELDS}  # fmt: skip
    offered = actions.offered(str(row["kind"]), caller.admin)
    out["actions"] = [] if row["state"] == names.ITEM_RESOLVED else sorted(offered)
    return out


def states(raw: str | None) -> list[str] | None:
    """`open`, `acked`, `resolved`, or several comma-separated; None for all."""
    if raw is None:
        return None
    wanted = raw.split(",")
    if not all(s in names.ITEM_STATES for s in wanted):
        raise InputInvalid("state", f"must be one or more of {', '.join(names.ITEM_STATES)}")
    return wanted


async def page(conn: Conn, caller: Caller, *, state: str | None = None,
               employee: str | None = None, kind: str | None = None, limit: int,
               cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:  # fmt: skip
    """One page of the caller's items, newest first, and the next page's cursor."""
    before = decode_cursor(cursor, (int,))
    cur = await conn.execute(Q["attention_list"], {
        "states": states(state), "employee": employee, "kind": kind, "admin": caller.admin,
        "audience": caller.audience, "since": caller.since,
        "before": None if before is None else before[0],
        "limit": limit + 1,
    })  # fmt: skip
    rows = await cur.fetchall()
    following = encode_cursor([int(rows[limit - 1]["id"])]) if len(rows) > limit else None
    return [view(r, caller) for r in rows[:limit]], following


async def _locked(conn: Conn, item_id: int, caller: Caller) -> dict[str, Any]:
    """The item, locked for this transaction, if the caller may see it."""
    cur = await conn.execute(Q["attention_item_lock"], {"id": item_id})
    row = await cur.fetchone()
    if row is None or not _mine(row, caller):
        raise NotFound(f"no attention item {item_id}")
    return row


async def _seen(conn: Conn, item_id: int, caller: Caller) -> dict[str, Any]:
    """The item, not locked (its kind and ref name what to lock first), if the caller may see
    it."""
    cur = await conn.execute(Q["attention_item_get"], {"id": item_id})
    row = await cur.fetchone()
    if row is None or not _mine(row, caller):
        raise NotFound(f"no attention item {item_id}")
    return row


async def _reread(conn: Conn, item_id: int, caller: Caller) -> dict[str, Any]:
    return view(await _locked(conn, item_id, caller), caller)


async def get(conn: Conn, item_id: int, caller: Caller) -> dict[str, Any]:
    """One item."""
    async with conn.transaction():
        return await _reread(conn, item_id, caller)


async def ack(conn: Conn, item_id: int, caller: Caller) -> dict[str, Any]:
    """Acknowledge an open item (again: unchanged); Conflict once resolved."""
    async with conn.transaction():
        item = await _locked(conn, item_id, caller)
        if item["state"] == names.ITEM_RESOLVED:
            raise Conflict(f"attention item {item_id} is resolved")
        await conn.execute(Q["attention_item_ack"], {"id": item_id, "by": caller.audience})
        return await _reread(conn, item_id, caller)


async def resolve(conn: Conn, item_id: int, caller: Caller) -> dict[str, Any]:
    """Resolve an open or acknowledged item by hand; Conflict once resolved."""
    async with conn.transaction():
        item = await _locked(conn, item_id, caller)
        if item["state"] == names.ITEM_RESOLVED:
            raise Conflict(f"attention item {item_id} is resolved")
        await conn.execute(Q["attention_item_close"], {"id": item_id, "by": caller.audience})
        return await _reread(conn, item_id, caller)


async def act(conn: Conn, item_id: int, action: str, body: dict[str, Any],
              caller: Caller) -> dict[str, Any]:  # fmt: skip
    """Take the item's action `action` (with its `body`); what it did."""
    if action not in actions.NAMES:
        raise InputInvalid("action", f"unknown action {action!r}; actions: "
                                     f"{', '.join(actions.NAMES)}")  # fmt: skip
    async with conn.transaction():
        item = await _seen(conn, item_id, caller)
        offered = actions.offered(str(item["kind"]), caller.admin)
        if action not in offered:
            mine = ", ".join(sorted(offered)) or "none"
            raise Conflict(f"attention item {item_id} ({item['kind']}) offers no {action!r} "
                           f"to this caller; it offers: {mine}")  # fmt: skip
        chosen = offered[action]
        if chosen.lock_first is not None:
            await chosen.lock_first(conn, item)
        item = await _locked(conn, item_id, caller)
        if item["state"] == names.ITEM_RESOLVED:
            raise Conflict(f"attention item {item_id} is resolved")
        if chosen.resolves:  # first: the action's own settling of its kin leaves this one be
            await conn.execute(Q["attention_item_close"], {"id": item_id, "by": caller.audience})
        done = await chosen.run(conn, item, body)
    return {"item": item_id, "action": action, **done}
