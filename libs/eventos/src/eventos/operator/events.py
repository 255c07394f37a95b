"""The operator event stream's reads (`GET /v1/events`; docs/events.md).

Events are placed by the sequencer (`eventos.owner.event_positions`); a reader goes on from the
place it last read (`Last-Event-ID`). A read walks at most SPAN places, so a reader whose
filters match few events (a user, one employee, one family) still reads a bounded part of the
index each time, and its place moves past what it did not match.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Gone, InputInvalid

RETENTION = timedelta(days=names.OPERATOR_EVENTS_RETENTION_DAYS)
SPAN = 1000  # places walked per read
READ_LIMIT = 100  # events per read
FAMILIES = frozenset(names.OPERATOR_EVENT_KINDS)
KINDS = frozenset(k for kinds in names.OPERATOR_EVENT_KINDS.values() for k in kinds)
MAX_PLACE = 2**63 - 1


@dataclass(frozen=True)
class Reader:
    """Whose events a stream shows: the caller's audience (all for the admin; a user's since
    its record was made), optionally one employee's, optionally some kinds or families."""

    audience: str
    admin: bool
    employee: str | None = None
    kinds: tuple[str, ...] = ()
    since: datetime | None = None


@dataclass(frozen=True)
class Read:
    """Events in their order, the place the stream is at after them, and whether more were
    placed beyond it already (read again at once)."""

    events: list[dict[str, Any]]
    last: int
    more: bool


def parse_kinds(raw: str | None) -> tuple[str, ...]:
    """`kind=` as kinds or families, comma-separated; InputInvalid for one the stream lacks."""
    given = tuple(k.strip() for k in (raw or "").split(",") if k.strip())
    for kind in given:
        if kind not in FAMILIES and kind not in KINDS:
            families = ", ".join(sorted(FAMILIES))
            raise InputInvalid("kind", f"{kind!r} is no family ({families}) nor one's kind")
    return given


def parse_place(raw: str, where: str) -> int:
    """A place a client read last (`Last-Event-ID` or `after`)."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_PLACE:
        raise InputInvalid(where, "must be a place this stream gave (a non-negative integer)")
    return int(raw)


async def top(conn: Conn) -> tuple[int, int]:
    """The last place given, and the place up to which events may have been deleted."""
    cur = await conn.execute(Q["operator_events_top"])
    row = await cur.fetchone() or {"top": 0, "pruned": 0}
    return int(row["top"]), int(row["pruned"])


async def start(conn: Conn, after: int | None) -> int:
    """Where a stream starts: after the place the client read last (Gone when the retention
    deleted events after it; InputInvalid when it is ahead of the stream), else now."""
    last, pruned = await top(conn)
    if after is None:
        return last
    if after < pruned:
        raise Gone(f"events after {after} are past the {RETENTION.days}-day retention; "
                   "start again without Last-Event-ID")  # fmt: skip
    if after > last:
        raise InputInvalid("Last-Event-ID", f"{after} is ahead of the stream (at {last})")
    return after


async def read(conn: Conn, reader: Reader, after: int) -> Read:
    """The reader's events placed after `after`, at most READ_LIMIT of them."""
    last, _ = await top(conn)  # read first: every place up to it is final in the next snapshot
    through = min(after + SPAN, last)
    params = {"after": after, "through": through, "admin": reader.admin,
              "audience": reader.audience, "employee": reader.employee,
              "kinds": list(reader.kinds), "limit": READ_LIMIT, "since": reader.since}  # fmt: skip
    cur = await conn.execute(Q["operator_events_after"], params)
    rows = await cur.fetchall()
    if len(rows) == READ_LIMIT:
        return Read(rows, int(rows[-1]["pos"]), more=True)
    return Read(rows, through, more=through < last)


# What only the admin reads of an event: which of the owner's rules held a reply (a user is
# told only that its reply is held for review, SPEC §17).
ADMIN_ONLY_DETAIL = ("held_reason",)


def view(row: dict[str, Any], admin: bool = True) -> dict[str, Any]:
    """An event as the stream shows it: ids, kinds, states and names, never content."""
    detail = row["detail"]
    if not admin and isinstance(detail, dict):
        detail = {k: v for k, v in detail.items() if k not in ADMIN_ONLY_DETAIL}
    return {"pos": row["pos"], "at": row["at"].isoformat(), "kind": row["kind"],
            "employee": row["employee"], "ref": row["ref"], "state": row["state"],
            "detail": detail}  # fmt: skip


async def expire(conn: Conn, batch: int = 10_000) -> int:
    """Delete events past the retention, a batch at a time; how many went."""
    gone = 0
    while True:
        cur = await conn.execute(Q["operator_events_expire"],
                                 {"days": RETENTION.days, "limit": batch})  # fmt: skip
        n = int((await cur.fetchone() or {"n": 0})["n"])
        gone += n
        if n < batch:
            return gone
