"""The console's reads that no other owner API operation gives, each one bounded page: employee
summaries, an employee's conversations and turns (with steps and cost), a chat session's
history. Rows leave as JSON-ready dicts (times in ISO 8601, money as numbers)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from eventos.console import cursor
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import InputInvalid, NotFound
from eventos.timeline.messages import reply_status

CHAT_EMPLOYEES_MAX = 200  # the employees a caller may pick to chat with
PENDING_CAP = 1000  # inputs counted per employee; past it the count says "at least"
STEPS_CAP = 50  # model calls, and tool calls, shown per turn
COUNT_CAP = 1000  # what the navigation counts, each; past it the console says "1000+"


@dataclass(frozen=True)
class Page:
    """One page of a list and the cursor of the next (None: this was the last)."""

    rows: list[dict[str, Any]]
    next_cursor: str | None


def plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row as JSON takes it: times as ISO 8601, numerics as numbers."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, Decimal):
            value = float(value)
        out[key] = value
    return out


def _page(rows: list[dict[str, Any]], limit: int, key: list[str]) -> Page:
    """The first `limit` rows (one more was read to know whether a next page exists)."""
    if len(rows) <= limit:
        return Page(rows, None)
    rows = rows[:limit]
    last = rows[-1]
    return Page(rows, cursor.encode([_key_value(last[k]) for k in key]))


def _key_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


async def employee_exists(conn: Conn, name: str) -> None:
    """NotFound unless the employee was applied."""
    cur = await conn.execute(Q["console_employee_exists"], {"name": name})
    if await cur.fetchone() is None:
        raise NotFound(f"no employee {name!r}")


async def chat_employees(conn: Conn) -> list[str]:
    """The employees that take owner chat now, by name."""
    cur = await conn.execute(Q["console_chat_employees"], {"limit": CHAT_EMPLOYEES_MAX})
    return [str(r["name"]) for r in await cur.fetchall()]


async def employee_summaries(conn: Conn, after: str | None, limit: int) -> Page:
    """Employees by name: state, generation, budget, pending inputs by class, open attention."""
    start = "" if after is None else str(cursor.decode(after, (str,))[0])
    cur = await conn.execute(Q["console_employee_page"], {"after": start, "limit": limit + 1})
    page = _page(await cur.fetchall(), limit, ["name"])
    names = [str(r["name"]) for r in page.rows]
    cur = await conn.execute(Q["console_pending_by_class"], {"names": names, "cap": PENDING_CAP})
    pending: dict[str, dict[str, int]] = {}
    for r in await cur.fetchall():
        pending.setdefault(str(r["employee"]), {})[f"C{r['class']}"] = int(r["n"])
    cur = await conn.execute(Q["console_attention_open_counts"], {"names": names})
    attention = {str(r["employee"]): int(r["n"]) for r in await cur.fetchall()}
    rows = [_summary(r, pending.get(r["name"], {}), attention.get(r["name"], 0))
            for r in page.rows]  # fmt: skip
    return Page(rows, page.next_cursor)


def _summary(row: dict[str, Any], pending: dict[str, int], attention: int) -> dict[str, Any]:
    r = plain(row)
    return {
        "name": r["name"],
        "state": r["state"] or "stopped",
        "pause_reason": r["pause_reason"],
        "generation": r["generation"],
        "budget": {"daily_usd": r["daily_usd"], "spent_usd": r["spent_usd"],
                   "reserved_usd": r["reserved_usd"], "state": r["budget_state"] or "normal"},
        "pending": dict(sorted(pending.items())),
        "pending_capped": sum(pending.values()) >= PENDING_CAP,
        "attention_open": attention,
    }  # fmt: skip


async def counts(conn: Conn, audience: str, admin: bool, since: datetime | None) -> dict[str, Any]:
    """What waits for the caller (the console's navigation): attention items open, approvals
    pending, outbox rows `unknown` (None for a user), each counted up to COUNT_CAP."""
    params = {"audience": audience, "admin": admin, "since": since, "cap": COUNT_CAP}
    cur = await conn.execute(Q["console_counts"], params)
    row = await cur.fetchone()
    assert row is not None  # one row, always
    return {**row, "cap": COUNT_CAP}


async def conversations(conn: Conn, employee: str, after: str | None, limit: int) -> Page:
    """An employee's conversations, newest generation first."""
    await employee_exists(conn, employee)
    gen, agent, thread = cursor.decode(after, (int, str, str)) if after else (None, None, None)
    params = {"employee": employee, "after_generation": gen, "after_agent": agent,
              "after_thread": thread, "limit": limit + 1}  # fmt: skip
    cur = await conn.execute(Q["console_conversations"], params)
    page = _page(await cur.fetchall(), limit, ["generation", "agent", "thread"])
    return Page([plain(r) for r in page.rows], page.next_cursor)


async def turns(
    conn: Conn, employee: str, thread: str | None, after: str | None, limit: int
) -> Page:
    """An employee's turns newest first, each with its steps (model and tool calls) and cost."""
    await employee_exists(conn, employee)
    at, ident = cursor.decode(after, (str, str)) if after else (None, None)
    if at is not None:
        try:
            datetime.fromisoformat(at)
        except ValueError:
            raise InputInvalid("cursor", "is not a cursor this list gave") from None
    params = {"employee": employee, "thread": thread, "before_at": at, "before_id": ident,
              "limit": limit + 1}  # fmt: skip
    cur = await conn.execute(Q["console_turns"], params)
    page = _page(await cur.fetchall(), limit, ["started_at", "id"])
    return Page(await _with_steps(conn, page.rows), page.next_cursor)


async def turn(conn: Conn, employee: str, turn_id: str) -> dict[str, Any]:
    """One turn of an employee with its steps and cost; NotFound when it has no such turn."""
    await employee_exists(conn, employee)
    cur = await conn.execute(Q["console_turn"], {"employee": employee, "turn_id": turn_id})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"{employee} has no turn {turn_id!r}")
    (found,) = await _with_steps(conn, [row])
    return found


async def _with_steps(conn: Conn, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids = [str(r["id"]) for r in rows]
    steps: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    for query, kind in (("console_turn_llm_steps", "llm"), ("console_turn_tool_steps", "tool")):
        cur = await conn.execute(Q[query], {"turns": ids, "cap": STEPS_CAP})
        for r in await cur.fetchall():
            steps[str(r.pop("turn_id"))].append({"kind": kind, **r})
    return [_turn(r, steps[str(r["id"])]) for r in rows]


def _turn(row: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    steps.sort(key=lambda s: s["at"])
    llm = [s for s in steps if s["kind"] == "llm"]
    return {
        **plain(row),
        "cost_usd": float(sum((s["usd"] or Decimal(0) for s in llm), Decimal(0))),
        "input_tokens": sum(s["input_tokens"] or 0 for s in llm),
        "output_tokens": sum(s["output_tokens"] or 0 for s in llm),
        "steps": [_step(s) for s in steps],
        "steps_capped": len(steps) >= STEPS_CAP,
    }


def _step(step: dict[str, Any]) -> dict[str, Any]:
    """A step as JSON, with how long it took (first attempt's start to last one's end)."""
    at, ended = step["at"], step.pop("ended_at")
    took = None if ended is None else round(max((ended - at).total_seconds(), 0.0), 3)
    return {**plain(step), "ended_at": None if ended is None else ended.isoformat(),
            "duration_s": took}  # fmt: skip


@dataclass(frozen=True)
class History:
    """A page of chat messages and the event id the live stream goes on from."""

    page: Page
    last_event_id: int


async def chat_history(
    conn: Conn,
    employee: str,
    audience: str,
    session: str,
    before: str | None,
    limit: int,
    since: datetime | None = None,
) -> History:
    """One audience's messages in a session (made at or after `since`: a user's record's
    creation), newest first, each with its reply."""
    (below,) = cursor.decode(before, (int,)) if before else (None,)
    params = {"employee": employee, "audience": audience, "session": session,
              "before": below, "limit": limit + 1, "since": since}  # fmt: skip
    async with conn.transaction():  # one snapshot: no reply both listed and streamed, or lost
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        await employee_exists(conn, employee)
        cur = await conn.execute(Q["console_chat_last_event"], params)
        last = int((await cur.fetchone() or {"id": 0})["id"])
        cur = await conn.execute(Q["console_chat_history"], params)
        page = _page(await cur.fetchall(), limit, ["id"])
    rows = [{"message_id": r["id"], "text": r["text"], "status": r["status"],
             "reply": r["reply"], "reply_status": reply_status(r),
             "created_at": r["created_at"].isoformat()} for r in page.rows]  # fmt: skip
    return History(Page(rows, page.next_cursor), last)
