"""Pages of an employee's timeline: keyset pagination on (at, id) up to a horizon.

A page is read in two statements. The first finds the horizon: the instant before which no
entry can still appear (eventos/db/queries/timeline.sql `timeline_horizon`); the second, in a
later snapshot, lists entries before it. So an entry whose transaction commits late, or an
input's `accepted` entry the router writes with its ingress row's older time, is never passed
by a cursor before it is visible: pages neither skip nor repeat a row while rows arrive.

A cursor is opaque to callers (base64 of its order, its position and the filters of the list
it continues, so a page asked with a cursor alone lists the same entries); `follow` is where to
ask for what happens next (oldest first, after the newest entry listed or the horizon).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import InputInvalid

NEWEST, OLDEST = "newest", "oldest"
ORDERS = (NEWEST, OLDEST)
RETENTION = timedelta(days=names.TIMELINE_RETENTION_DAYS)
CURSOR_MAX_CHARS = 2000
Query = dict[str, str]  # a list's filters as asked (chain, thread, kind, since, until)


@dataclass(frozen=True)
class Position:
    """A place in the timeline's order (entries are ordered by (at, id)) of a list."""

    order: str
    at: datetime
    id: int
    query: Query = field(default_factory=dict)

    def encode(self) -> str:
        """The opaque cursor of this position."""
        raw = json.dumps([self.order, self.at.isoformat(), self.id, self.query]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> Position:
    """The position a cursor names; InputInvalid for anything this API did not hand out."""
    try:
        if len(text) > CURSOR_MAX_CHARS:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        order, at, entry_id, query = json.loads(raw)
        when = datetime.fromisoformat(at)
        if order not in ORDERS or when.tzinfo is None or type(entry_id) is not int:
            raise ValueError("not a cursor")
        if not 0 <= entry_id < 2**63:
            raise ValueError("id out of range")
        if not isinstance(query, dict) or not all(isinstance(v, str) for v in query.values()):
            raise ValueError("not a cursor's filters")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError, RecursionError):
        raise InputInvalid("cursor", "is not a cursor this API gave out") from None
    return Position(order, when, entry_id, query)


@dataclass(frozen=True)
class Filters:
    """What a page lists: one employee, optionally one thread, one chain, some kinds, and a
    time range [since, until)."""

    employee: str
    query: Query = field(default_factory=dict)  # the filters as asked, for the cursors
    thread: str | None = None
    chain: str | None = None
    kinds: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class Page:
    """Entries in the page's order; `next` continues in that order (None: no more now);
    `follow` asks, oldest first, for what happens after this answer."""

    entries: list[dict[str, Any]]
    next: Position | None
    follow: Position
    horizon: datetime


async def horizon(conn: Conn, employee: str) -> datetime:
    """The instant before which the employee's timeline no longer changes."""
    cur = await conn.execute(Q["timeline_horizon"], {"employee": employee})
    row = await cur.fetchone()
    return row["horizon"] if row else datetime.now(UTC)


async def page(conn: Conn, f: Filters, order: str, cursor: Position | None, limit: int) -> Page:
    """One page of entries (at most `limit`), in `order` from `cursor`."""
    if cursor is not None:
        order = cursor.order
    edge = await horizon(conn, f.employee)
    since = edge - RETENTION if f.since is None else max(f.since, edge - RETENTION)
    until = edge if f.until is None else min(f.until, edge)
    newest = order == NEWEST
    params: dict[str, Any] = {
        "employee": f.employee, "thread": f.thread, "chain": f.chain, "kinds": list(f.kinds),
        "since": since, "until": until, "limit": limit + 1,
        "before_at": cursor.at if cursor else None, "before_id": cursor.id if cursor else None,
        "after_at": cursor.at if cursor else None, "after_id": cursor.id if cursor else None,
    }  # fmt: skip
    name = "timeline_newest" if newest else "timeline_oldest"
    query = Q[name + "_of_kinds"] if f.kinds else Q[name]
    # Planned with the values each time: a generic plan would keep the NULL filters and pick
    # one index for every combination of them.
    cur = await conn.execute(query, params, prepare=False)
    rows = await cur.fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if rows else None
    following = Position(order, last["at"], int(last["id"]), f.query) if more and last else None
    return Page(rows, following, _follow(rows, newest, cursor, until, f.query), edge)


def _follow(rows: list[dict[str, Any]], newest: bool, cursor: Position | None,
            until: datetime, query: Query) -> Position:  # fmt: skip
    """Where entries after this answer start: after its newest row, else after the cursor
    (oldest first), else at the end of what was listed."""
    if rows:
        top = rows[0] if newest else rows[-1]
        return Position(OLDEST, top["at"], int(top["id"]), query)
    if cursor is not None and cursor.order == OLDEST:
        return cursor
    return Position(OLDEST, until, 0, query)


async def expire(conn: Conn, batch: int = 10_000) -> int:
    """Delete entries past the retention, a batch at a time; how many went."""
    gone = 0
    while True:
        cur = await conn.execute(Q["timeline_expire"], {"days": RETENTION.days, "limit": batch})
        n = int((await cur.fetchone() or {"n": 0})["n"])
        gone += n
        if n < batch:
            return gone
