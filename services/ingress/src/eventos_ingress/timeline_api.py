"""The owner API's timeline and why-waiting views of an employee (SPEC §12, §17), admin only.

`GET /v1/employees/{name}/timeline?chain=&thread=&kind=&since=&until=&order=&cursor=&limit=`
lists what happened, newest first by default (`order=oldest` for the other way); `kind` takes
kinds or families (`turn`, `input.dead`), comma-separated. Each entry says what happened in
words and links its source row by `ref`; it never carries message text. `next_cursor` pages on
(null: no more now), `follow_cursor` asks later for what happened since.
`GET /v1/employees/{name}/waiting?limit=` lists every input not consumed yet with the gate
that holds it, and how many more there are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from eventos import names
from eventos.db import Conn
from eventos.employees import lifecycle
from eventos.errors import InputInvalid
from eventos.scheduling.policy import SchedConfig
from eventos.timeline import entries, waiting
from eventos.timeline.words import summary

PAGE_DEFAULT = 50
PAGE_MAX = 200
FILTER_MAX_CHARS = 200
FILTERS = ("chain", "thread", "kind", "since", "until")
KINDS = {k for family in names.TIMELINE_KINDS.values() for k in family}


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return PAGE_DEFAULT
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw[:4]) <= PAGE_MAX:
        raise InputInvalid("limit", f"must be an integer in 1..{PAGE_MAX}")
    return int(raw)


def _text(request: Request, key: str) -> str | None:
    value = request.query_params.get(key)
    if value is not None and not 0 < len(value) <= FILTER_MAX_CHARS:
        raise InputInvalid(key, f"must be 1 to {FILTER_MAX_CHARS} characters")
    return value


def _time(query: entries.Query, key: str) -> datetime | None:
    raw = query.get(key)
    if raw is None:
        return None
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InputInvalid(key, "must be an ISO 8601 time with an offset (2026-01-31T12:00Z)")
    return when


def _kinds(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return ()
    out: list[str] = []
    for part in (p.strip() for p in raw.split(",")):
        if part in names.TIMELINE_KINDS:
            out.extend(names.TIMELINE_KINDS[part])
        elif part in KINDS:
            out.append(part)
        else:
            families = ", ".join(names.TIMELINE_KINDS)
            raise InputInvalid("kind", f"unknown kind {part!r}; use a family ({families}) or "
                               "one of its kinds (turn.done)")  # fmt: skip
    return tuple(dict.fromkeys(out))


def entry_view(row: dict[str, Any]) -> dict[str, Any]:
    """One entry as the API shows it."""
    chains = list(row["chains"] or [])
    return {
        "id": int(row["id"]), "at": row["at"].isoformat(), "kind": row["kind"],
        "chain_id": chains[0] if chains else None, "chains": chains, "thread": row["thread"],
        "summary": summary(row["kind"], row["detail"]), "ref": row["ref"],
        "detail": row["detail"],
    }  # fmt: skip


@dataclass
class TimelineApi:
    pool: AsyncConnectionPool[Conn]
    sched: SchedConfig = field(default_factory=SchedConfig)

    async def list(self, request: Request, caller: object) -> Response:
        """What happened to an employee's work, a page at a time (admin only)."""
        name = request.path_params["name"]
        order = request.query_params.get("order", entries.NEWEST)
        if order not in entries.ORDERS:
            raise InputInvalid("order", f"must be one of {', '.join(entries.ORDERS)}")
        raw_cursor = _text(request, "cursor")
        cursor = entries.decode_cursor(raw_cursor) if raw_cursor else None
        query = {k: v for k in FILTERS if (v := _text(request, k)) is not None}
        if cursor is not None:
            if "order" in request.query_params and cursor.order != order:
                raise InputInvalid("cursor", f"was given out for order={cursor.order}")
            for k, v in query.items():
                if cursor.query.get(k) != v:
                    raise InputInvalid(k, "differs from the cursor's: a cursor goes on with the "
                                       "filters of the list it came from")  # fmt: skip
            query = cursor.query
        f = entries.Filters(name, query, query.get("thread"), query.get("chain"),
                            _kinds(query.get("kind")), _time(query, "since"),
                            _time(query, "until"))  # fmt: skip
        limit = _limit(request)
        async with self.pool.connection() as conn:
            await lifecycle.known(conn, name)  # 404 for one that never was (a deleted one's stays)
            page = await entries.page(conn, f, order, cursor, limit)
        return JSONResponse({
            "timeline": [entry_view(r) for r in page.entries],
            "next_cursor": page.next.encode() if page.next else None,
            "follow_cursor": page.follow.encode(), "as_of": page.horizon.isoformat(),
        })  # fmt: skip

    async def waiting(self, request: Request, caller: object) -> Response:
        """Every input not consumed yet and the gate holding it (admin only)."""
        name, limit = request.path_params["name"], _limit(request)
        async with self.pool.connection() as conn:
            found = await waiting.waiting(conn, name, limit, self.sched)
        return JSONResponse({
            "waiting": found.entries, "more": found.more,
            "as_of": found.as_of.isoformat() if found.as_of else None,
        })  # fmt: skip
