"""The `degraded` employee (SPEC §12): too many of its turns fail, or too many of its threads
are quarantined.

A pass (the relay's, taking `now`) counts each employee's turns that ended within
`degraded_window_s` (15 minutes): with at least `degraded_min_failed` (10) failed and a share
of at least `degraded_share` (30%), or with `degraded_quarantined` (3) threads quarantined, it
becomes degraded: the relay holds its streams whose pending input is all background work
(`hold_reason` `degraded`, as the budget's `high` does), admission refuses its C3/C4 turns (C1
and C2 go on; a C3/C4 turn already running finishes), and the owner is told (an attention item
`employee_degraded` offering `clear`, and a notice in the owner's chat). It clears by itself
on a pass that finds it below both thresholds, or at once when the owner takes `clear`, which
also starts its window anew (turns and quarantines before it no longer count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict
from eventos.runtime.metrics import DEGRADED_TRANSITIONS
from eventos.settings import SupervisionSettings

EMPLOYEES_READ: Final = 1000  # employees judged per pass
BY_OWNER: Final = "owner"
BY_RECOVERY: Final = "recovered"


@dataclass
class Judged:
    """What one pass changed."""

    degraded: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)


def reason_for(row: dict[str, Any], cfg: SupervisionSettings) -> str | None:
    """Why an employee's figures make it degraded, or None when they do not."""
    failed, ended = int(row["failed"]), int(row["ended"])
    minutes = int(cfg.degraded_window_s // 60)
    if failed >= cfg.degraded_min_failed and failed >= cfg.degraded_share * ended:
        return f"{failed} of {ended} turns failed within {minutes} minutes"
    if int(row["quarantined"]) >= cfg.degraded_quarantined:
        return f"{row['quarantined']} threads are quarantined"
    return None


async def judge(conn: Conn, cfg: SupervisionSettings, now: datetime) -> Judged:
    """Degrade the employees past a threshold; recover those below both."""
    since = now - timedelta(seconds=cfg.degraded_window_s)
    cur = await conn.execute(Q["employees_health_facts"],
                             {"since": since, "now": now, "limit": EMPLOYEES_READ})  # fmt: skip
    done = Judged()
    for row in await cur.fetchall():
        employee, reason = str(row["employee"]), reason_for(row, cfg)
        was = row["degraded_since"] is not None
        if reason is not None and not was and await degrade(conn, employee, reason, now):
            done.degraded.append(employee)
            DEGRADED_TRANSITIONS.labels(names.HOLD_DEGRADED).inc()
        elif reason is None and was and await recover(conn, employee, BY_RECOVERY, now):
            done.recovered.append(employee)
            DEGRADED_TRANSITIONS.labels(BY_RECOVERY).inc()
    return done


async def degrade(conn: Conn, employee: str, reason: str, now: datetime) -> bool:
    """Make the employee degraded and tell the owner; False when it already was."""
    async with conn.transaction():
        cur = await conn.execute(Q["employee_degrade"],
                                 {"employee": employee, "now": now, "reason": reason})  # fmt: skip
        if await cur.fetchone() is None:
            return False
        how = ("Background work (C3, C4) waits; owner and customer conversations go on. It "
               "clears by itself once fewer turns fail, or take the `clear` action")  # fmt: skip
        await conn.execute(Q["attention_raise_action"], {
            "employee": employee, "kind": names.ATTENTION_EMPLOYEE_DEGRADED, "severity": "error",
            "ref": employee, "action": names.ACTION_CLEAR, "thread": None,
            "detail": f"{employee} is degraded: {reason}. {how}",
        })  # fmt: skip
        await conn.execute(Q["chat_notice_insert"], {
            "employee": employee, "session": names.DEFAULT_SESSION,
            "dedupe_key": f"degraded:{employee}:{now.isoformat()}",
            "text": f"{employee} is degraded: {reason}. {how}.",
        })  # fmt: skip
    return True


async def recover(conn: Conn, employee: str, by: str, now: datetime) -> bool:
    """The employee is no longer degraded: its held background work goes on and its item is
    resolved; False when it was not degraded."""
    async with conn.transaction():
        cur = await conn.execute(Q["employee_recover"],
                                 {"employee": employee, "by": by, "now": now})  # fmt: skip
        if await cur.fetchone() is None:
            return False
        await conn.execute(Q["streams_release_degraded"], {"employee": employee})
        await conn.execute(Q["attention_resolve"], {"kind": names.ATTENTION_EMPLOYEE_DEGRADED,
                                                    "ref": employee})  # fmt: skip
    return True


async def lock_health(conn: Conn, employee: str) -> None:
    """Lock an employee's health row, as the supervision pass does before it touches the
    employee's item (the one order that cannot deadlock)."""
    await conn.execute(Q["employee_health_lock"], {"employee": employee})


async def clear(conn: Conn, employee: str, now: datetime) -> dict[str, Any]:
    """The owner clears a degraded employee at once (its health row locked by the caller;
    Conflict if it is not degraded)."""
    if not await recover(conn, employee, BY_OWNER, now):
        raise Conflict(f"{employee} is not degraded")
    return {"employee": employee}


async def view(conn: Conn, employee: str) -> dict[str, Any] | None:
    """An employee's degraded state for the API (`since`, `reason`), or None."""
    cur = await conn.execute(Q["employee_health_get"], {"employee": employee})
    row = await cur.fetchone()
    if row is None:
        return None
    return {"since": row["degraded_since"].isoformat(), "reason": row["reason"]}
