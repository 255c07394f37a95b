"""The turn watchdog (SPEC §12): slow-turn alerts per class and the 24-hour backstop.

A pass reads the running turns. A turn older than its class's threshold (C1 and C2 15 min, C3
30 min, C4 60 min), not counting the time it held no slot (suspended by the budget, parked),
raises one `slow_turn` attention item and counts in `eventos_slow_turns_total`. A turn with no
completed step for 24 hours (and holding a slot) is cancelled; if it still runs 2 minutes later
it is terminated, its children with it. Passes take `now` as an argument, so tests drive the
clock; many relay replicas may run passes at once (each step is a compare-and-swap or
idempotent in Temporal).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.runtime.metrics import BACKSTOPS, SLOW_TURNS
from eventos.runtime.temporal import TemporalConnection

log = logging.getLogger(__name__)
SLOW_AFTER: Final = {
    names.C1_OWNER: timedelta(minutes=15),
    names.C2_CUSTOMER: timedelta(minutes=15),
    names.C3_INTERNAL: timedelta(minutes=30),
    names.C4_BACKGROUND: timedelta(minutes=60),
}
BACKSTOP_AFTER: Final = timedelta(hours=24)
TERMINATE_AFTER: Final = timedelta(minutes=2)
WATCH_EVERY_S: Final = 60.0
WATCH_LIMIT: Final = 5000
CALL_TIMEOUT: Final = timedelta(seconds=10)


@dataclass
class Watched:
    """What one pass did."""

    slow: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)


async def watch_once(pool: AsyncConnectionPool[Conn], client: Client,
                     now: datetime | None = None) -> Watched:  # fmt: skip
    """One pass over the running turns at `now`."""
    now = now or datetime.now(UTC)
    done = Watched()
    async with pool.connection() as conn:
        cur = await conn.execute(Q["watch_turns"], {"now": now, "limit": WATCH_LIMIT})
        turns = await cur.fetchall()
        for t in turns:
            klass = int(t["class"])
            if t["active_s"] > SLOW_AFTER[klass].total_seconds() and await _alert(conn, t, now):
                done.slow.append(t["id"])
                SLOW_TURNS.labels(f"c{klass}").inc()
    for t in turns:
        if t["lease_state"] == "suspended" or t["idle_s"] <= BACKSTOP_AFTER.total_seconds():
            continue
        handle = client.get_workflow_handle(t["id"])
        try:
            if t["backstop_at"] is None:
                await handle.cancel(rpc_timeout=CALL_TIMEOUT)
                async with pool.connection() as conn:
                    await conn.execute(Q["turn_backstopped"], {"turn_id": t["id"], "now": now})
                done.cancelled.append(t["id"])
                BACKSTOPS.labels("cancelled").inc()
            elif now - t["backstop_at"] >= TERMINATE_AFTER:
                await handle.terminate("no completed step for 24 hours; cancel was not enough",
                                       rpc_timeout=CALL_TIMEOUT)  # fmt: skip
                done.terminated.append(t["id"])
                BACKSTOPS.labels("terminated").inc()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:  # closed meanwhile: nothing to do
                raise
    return done


async def _alert(conn: Conn, t: dict[str, Any], now: datetime) -> bool:
    async with conn.transaction():
        cur = await conn.execute(Q["turn_slow_alerted"], {"turn_id": t["id"], "now": now})
        if await cur.fetchone() is None:
            return False
        limit = SLOW_AFTER[int(t["class"])]
        await conn.execute(Q["attention_raise"], {
            "employee": t["employee"], "kind": names.ATTENTION_SLOW_TURN, "severity": "warning",
            "ref": t["id"], "detail": f"C{t['class']} turn running for more than "
            f"{int(limit.total_seconds() // 60)} minutes (suspended or parked time not counted)",
        })  # fmt: skip
    return True


async def watchdog_loop(pool: AsyncConnectionPool[Conn], temporal: TemporalConnection,
                        every_s: float = WATCH_EVERY_S) -> None:  # fmt: skip
    """A pass every minute until cancelled; errors are logged and the next pass tries again."""
    while True:
        try:
            await watch_once(pool, await temporal.get())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Temporal or the database away: try again next time
            log.warning("watchdog pass failed: %s", exc)
        await asyncio.sleep(every_s)
