"""The daily spend ledger (SPEC §9): reservations before each paid LLM call, settlement after,
and the budget's state, `normal` → `high` (≥ 80%) → `max`.

A reservation is keyed (`spend_events.key` is UNIQUE), so a retried call counts once. At
`high` background classes (C3, C4) are refused: admission and the relay hold them, and a
running background turn suspends at its next step. A reservation that would pass 100% is
refused (`BudgetExceeded`): the state becomes `max` and the employee is paused with
`pause_reason=budget` through an intent, with an attention item and a notice in the owner's
chat. States only rise within a period; `refresh` lowers them, at the period's end (the
owner's midnight plus a stable offset of 0-10 minutes) or after a top-up.

A user's chat (SPEC §17: the owner's guest) spends within its own daily cap with the employee
(`allowance`): past it, and whenever its step would pass the employee's budget, the step is
held (`BudgetHeld`: the turn suspends until a refresh) and the employee is never paused for it.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from eventos import names
from eventos.contracts import Control
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.employees import intents, lifecycle
from eventos.errors import BudgetExceeded, BudgetHeld
from eventos.runtime.metrics import BUDGET_TRANSITIONS

log = logging.getLogger(__name__)
OFFSET_MAX_S = 600
HELD_CLASSES = (names.C3_INTERNAL, names.C4_BACKGROUND)
STATE_RANK = {names.BUDGET_NORMAL: 0, names.BUDGET_HIGH: 1, names.BUDGET_MAX: 2}


@dataclass(frozen=True)
class Reservation:
    """One paid call's upper estimate, under its spend key."""

    key: str
    employee: str
    turn_id: str
    klass: int
    model: str
    estimate_usd: Decimal


@dataclass(frozen=True)
class Refreshed:
    """What `refresh` changed: the state, the period's end, whether the generation resumed
    (and its control block), and the suspended turns that may go on."""

    state: str
    period_end: datetime
    resumed: Control | None
    released_turns: list[str]


def offset_of(employee: str) -> int:
    """The employee's stable offset after midnight, 0-600 s (periods do not all end at once)."""
    digest = hashlib.sha256(employee.encode()).digest()
    return int.from_bytes(digest[:4], "big") % (OFFSET_MAX_S + 1)


def period_of(zone: str, offset_s: int, now: datetime) -> tuple[datetime, datetime]:
    """The budget period around `now`: from the owner's last midnight + offset to the next,
    as UTC instants (a day is 23 or 25 hours across a DST change)."""
    tz = ZoneInfo(zone)

    def boundary(day: date) -> datetime:
        local = datetime.combine(day, time(0), tzinfo=tz) + timedelta(seconds=offset_s)
        return local.astimezone(UTC)

    day = now.astimezone(tz).date()
    if boundary(day) > now:
        day -= timedelta(days=1)
    return boundary(day), boundary(day + timedelta(days=1))


@dataclass(frozen=True)
class Allowance:
    """A user's spend with one employee today: used, its cap (None: no limit), and when the
    period ends (None before the employee's budget was first used)."""

    used: Decimal
    cap: Decimal | None
    period_end: datetime | None

    @property
    def spent(self) -> bool:
        return self.cap is not None and self.used >= self.cap


def user_cap(limit: Decimal | None, own: Decimal | None) -> Decimal | None:
    """A user's daily cap with an employee: the admin's `daily_usd` for it, else
    `names.USER_DAILY_SHARE` of the employee's daily budget (None: neither is set)."""
    if own is not None:
        return own
    return None if limit is None else limit * Decimal(str(names.USER_DAILY_SHARE))


async def allowance(conn: Conn, employee: str, thread: str, own: Decimal | None) -> Allowance:
    """What the user of `thread` spent with `employee` in the current period, and its cap."""
    cur = await conn.execute(Q["user_spend"], {"employee": employee, "thread": thread})
    row = await cur.fetchone()
    if row is None or (row["period_end"] is not None and row["period_end"] <= datetime.now(UTC)):
        cur = await conn.execute(Q["budget_source"], {"employee": employee})
        source = await cur.fetchone() or {}
        return Allowance(Decimal(0), user_cap(source.get("daily_usd"), own), None)
    return Allowance(Decimal(row["used_usd"]), user_cap(row["daily_usd"], own), row["period_end"])


def state_for(used: Decimal, limit: Decimal | None) -> str:
    """The state a spend level puts the budget in (`max` only once a reservation failed)."""
    if limit is None or used < limit * Decimal(str(names.BUDGET_HIGH_SHARE)):
        return names.BUDGET_NORMAL
    return names.BUDGET_HIGH if used < limit else names.BUDGET_MAX


async def _budget(conn: Conn, employee: str, now: datetime) -> dict[str, Any] | None:
    """The employee's budget row, locked, with the current limit; made on first use. A period
    that ended is rolled here too (the supervisor's timer also releases what it held). None
    without a live generation (nothing runs that could spend)."""
    cur = await conn.execute(Q["budget_source"], {"employee": employee})
    source = await cur.fetchone()
    if source is None:
        return None
    start, end = period_of(source["timezone"], offset_of(employee), now)
    await conn.execute(Q["budget_insert"], {
        "employee": employee, "daily_usd": source["daily_usd"], "timezone": source["timezone"],
        "offset_s": offset_of(employee), "period_start": start, "period_end": end,
    })  # fmt: skip
    cur = await conn.execute(Q["budget_lock"], {"employee": employee})
    row = dict(await cur.fetchone() or {})
    row["daily_usd"] = source["daily_usd"]
    row["pause_reason"] = source["pause_reason"]
    row["generation_state"] = source["state"]
    if now >= row["period_end"]:
        # The new period starts where the last one ended (its boundaries are data: a test or
        # an operator may move the end), or at the last boundary after a long outage.
        row.update(period_start=max(row["period_end"], start), period_end=end,
                   state=names.BUDGET_NORMAL)  # fmt: skip
    return row


async def _save(conn: Conn, row: dict[str, Any], state: str) -> None:
    if state != row["state"]:
        BUDGET_TRANSITIONS.labels(state).inc()
        log.info("budget of %s: %s -> %s", row["employee"], row["state"], state)
    await conn.execute(Q["budget_update"], {
        "employee": row["employee"], "daily_usd": row["daily_usd"], "timezone": row["timezone"],
        "period_start": row["period_start"], "period_end": row["period_end"], "state": state,
    })  # fmt: skip


async def reserve(conn: Conn, r: Reservation, now: datetime | None = None) -> str:
    """Reserve the estimate (once per key); the budget's state after it. Raises BudgetHeld for
    background work past 80%, BudgetExceeded past 100% (after pausing the employee)."""
    now = now or datetime.now(UTC)
    async with conn.transaction():
        row = await _budget(conn, r.employee, now)
        if row is None:
            return names.BUDGET_NORMAL
        cur = await conn.execute(Q["spend_event_get"], {"key": r.key})
        if await cur.fetchone() is not None:
            await _save(conn, row, row["state"])
            return str(row["state"])
        period = {"employee": r.employee, "period_start": row["period_start"]}
        cur = await conn.execute(Q["spend_open"], period)
        spend = await cur.fetchone() or {}
        limit = row["daily_usd"]
        state = str(row["state"])
        if state == names.BUDGET_HIGH and r.klass in HELD_CLASSES:
            raise BudgetHeld(f"{r.employee}'s budget is {state}: background work waits")
        used = spend["spent_usd"] + spend["reserved_usd"] + r.estimate_usd
        new = state_for(used, limit)
        await _guest_check(conn, r, row, new)
        if state == names.BUDGET_MAX:
            pass  # paused until the period ends or a top-up
        elif new == names.BUDGET_MAX:
            await _save(conn, row, names.BUDGET_MAX)
            await _pause(conn, r.employee, row, limit)
        else:
            await conn.execute(Q["spend_event_insert"], {
                **period, "key": r.key, "turn_id": r.turn_id, "class": r.klass, "model": r.model,
                "estimate": r.estimate_usd,
            })  # fmt: skip
            await conn.execute(Q["spend_reserve"], {**period, "estimate": r.estimate_usd})
            new = max(new, state, key=STATE_RANK.__getitem__)
            if new == names.BUDGET_HIGH and state == names.BUDGET_NORMAL:
                await _raise(conn, r.employee, names.ATTENTION_BUDGET_HIGH, "warning",
                             f"spent or reserved {used:.2f} of {limit:.2f} USD today: "
                             "background work (C3, C4) waits")  # fmt: skip
            await _save(conn, row, new)
            return new
    raise BudgetExceeded(f"{r.employee} reached its daily budget of {limit:.2f} USD")


async def _guest_check(conn: Conn, r: Reservation, row: dict[str, Any], new: str) -> None:
    """A user's chat step (SPEC §17: a guest of the owner) waits (BudgetHeld) once the user
    spent its daily cap, and never pauses the employee: a step that would pass the employee's
    budget waits for the next period instead, and the owner's work goes on."""
    if names.USER_THREAD_PREFIX not in r.turn_id:
        return
    cur = await conn.execute(Q["turn_thread"], {"turn_id": r.turn_id})
    turn = await cur.fetchone()
    thread = str((turn or {}).get("thread") or "")
    if not thread.startswith(names.USER_THREAD_PREFIX):
        return
    if new == names.BUDGET_MAX or row["state"] == names.BUDGET_MAX:
        raise BudgetHeld(f"{r.employee}'s daily budget has no room for a user's chat")
    cur = await conn.execute(Q["user_of_thread"], {"thread": thread})
    user = await cur.fetchone()
    mine = await allowance(conn, r.employee, thread, (user or {}).get("daily_usd"))
    if mine.spent:
        raise BudgetHeld(f"the user's daily spend cap with {r.employee} is reached")


async def _pause(conn: Conn, employee: str, row: dict[str, Any], limit: Decimal) -> None:
    """At `max`: Stop with `pause_reason=budget`, an attention item and a notice with Resume."""
    if row["generation_state"] == names.GEN_RUNNING:
        await intents.pause_for_budget(conn, employee)
    # Resume means raising the limit: a plain Resume would meet the same full budget.
    how = (f"Resume it by raising the limit (`eventosctl limits {employee} --daily-usd N`); "
           f"it resumes by itself at {row['period_end'].isoformat()}")  # fmt: skip
    await _raise(conn, employee, names.ATTENTION_BUDGET_MAX, "error",
                 f"daily budget of {limit:.2f} USD reached: paused. {how}")  # fmt: skip
    await conn.execute(Q["chat_notice_insert"], {
        "employee": employee, "session": names.DEFAULT_SESSION,
        "dedupe_key": f"budget-max:{employee}:{row['period_start'].isoformat()}",
        "text": f"{employee} reached its daily budget of {limit:.2f} USD and is paused. {how}.",
    })  # fmt: skip


async def _raise(conn: Conn, employee: str, kind: str, severity: str, detail: str) -> None:
    await conn.execute(Q["attention_raise"], {"employee": employee, "kind": kind,
                                              "severity": severity, "ref": employee,
                                              "detail": detail})  # fmt: skip


async def settle(conn: Conn, key: str, actual_usd: Decimal, input_tokens: int = 0,
                 output_tokens: int = 0, *, released: bool = False) -> None:  # fmt: skip
    """The call's actual cost replaces its estimate (`released`: the call cost nothing);
    once per key."""
    async with conn.transaction():
        cur = await conn.execute(Q["spend_event_settle"], {
            "key": key, "state": "released" if released else "settled", "actual": actual_usd,
            "input_tokens": input_tokens, "output_tokens": output_tokens,
        })  # fmt: skip
        event = await cur.fetchone()
        if event is None:
            return
        await conn.execute(Q["spend_settle"], {
            "employee": event["employee"], "period_start": event["period_start"],
            "estimate": event["estimate_usd"], "actual": actual_usd,
        })  # fmt: skip
        if not released:
            await conn.execute(Q["turn_stepped"], {"turn_id": event["turn_id"]})


async def refresh(conn: Conn, employee: str, now: datetime | None = None) -> Refreshed:
    """Lower the state after a period ended or a top-up: below `max` a budget pause is
    resumed, at `normal` held streams go back to the relay; the suspended turns that may go on
    are named."""
    now = now or datetime.now(UTC)
    async with conn.transaction():
        row = await _budget(conn, employee, now)
        if row is None:
            return Refreshed(names.BUDGET_NORMAL, now + timedelta(days=1), None, [])
        period = {"employee": employee, "period_start": row["period_start"]}
        spend = await (await conn.execute(Q["spend_open"], period)).fetchone() or {}
        used = spend["spent_usd"] + spend["reserved_usd"]
        state = state_for(used, row["daily_usd"])
        if state == names.BUDGET_MAX and row["state"] != names.BUDGET_MAX:
            state = names.BUDGET_HIGH  # `max` is entered by a refused reservation only
        await _save(conn, row, state)
        resumed = None
        if state != names.BUDGET_MAX:
            resumed = await _resume(conn, employee, row)
            await conn.execute(Q["attention_resolve"], {"kind": names.ATTENTION_BUDGET_MAX,
                                                        "ref": employee})  # fmt: skip
        if state == names.BUDGET_NORMAL:
            await conn.execute(Q["streams_release_budget"], {"employee": employee})
            await conn.execute(Q["attention_resolve"], {"kind": names.ATTENTION_BUDGET_HIGH,
                                                        "ref": employee})  # fmt: skip
        cur = await conn.execute(Q["leases_suspended"], {"employee": employee})
        released = [
            str(t["turn_id"])
            for t in await cur.fetchall()
            if state == names.BUDGET_NORMAL
            or (state == names.BUDGET_HIGH and t["class"] not in HELD_CLASSES)
        ]
    return Refreshed(state, row["period_end"], resumed, released)


async def _resume(conn: Conn, employee: str, row: dict[str, Any]) -> Control | None:
    """Resume a generation the budget paused; its new control block (the caller is its
    supervisor, so no intent is written)."""
    if row["generation_state"] != names.GEN_PAUSED or row["pause_reason"] != names.PAUSE_BUDGET:
        return None
    ref = await lifecycle.resume(conn, employee)
    params = {"employee": employee, "generation": ref.generation}
    cur = await conn.execute(Q["generation_bump_revision"], params)
    return Control.from_row(await cur.fetchone() or {})
