"""The supervision items' actions, as entries of `eventos.operator.actions.ACTIONS`: `release`
on a `thread_quarantined` item, `clear` on an `employee_degraded` item. Each locks what the
supervision pass locks first (the thread's stream, the employee's health row) before the item
is locked. Database only (I2): the relay's next supervision pass wakes the entities."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from eventos.db import Conn
from eventos.health import degraded, intensity


async def lock_thread(conn: Conn, item: dict[str, Any]) -> None:
    """Before the item: the quarantined thread's stream (`ref`)."""
    await intensity.lock_thread(conn, str(item["ref"]))


async def release_thread(conn: Conn, item: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """`release`: the thread's held inputs run again in order."""
    return await intensity.release(conn, str(item["ref"]))


async def lock_employee(conn: Conn, item: dict[str, Any]) -> None:
    """Before the item: the degraded employee's health row (`ref`)."""
    await degraded.lock_health(conn, str(item["ref"]))


async def clear_degraded(conn: Conn, item: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """`clear`: the employee's background work goes on at once."""
    return await degraded.clear(conn, str(item["ref"]), datetime.now(UTC))
