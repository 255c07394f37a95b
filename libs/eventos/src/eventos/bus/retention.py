"""Retention of the bus's settled rows (SPEC §15; docs/dead-letters.md): finished deliveries
go after 30 days, dead letters (dead deliveries, dead ingress rows kept past their daily
partition) after 90. Each sweep deletes a bounded batch a statement, oldest first."""

from __future__ import annotations

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q

BATCH = 5000


async def _sweep(conn: Conn, query: str, params: dict[str, int], batch: int) -> int:
    gone = 0
    while True:
        cur = await conn.execute(Q[query], {**params, "limit": batch})
        n = int((await cur.fetchone() or {"n": 0})["n"])
        gone += n
        if n == 0:
            return gone


async def expire_deliveries(conn: Conn, batch: int = BATCH) -> int:
    """Delete deliveries past their retention, a batch at a time; how many went."""
    params = {"days": names.DELIVERY_RETENTION_DAYS, "dead_days": names.DEAD_LETTER_RETENTION_DAYS}
    return await _sweep(conn, "deliveries_expire", params, batch)


async def expire_dead_ingress(conn: Conn, batch: int = BATCH) -> int:
    """Delete kept dead ingress rows past 90 days, a batch at a time; how many went."""
    return await _sweep(conn, "dead_ingress_expire",
                        {"days": names.DEAD_LETTER_RETENTION_DAYS}, batch)  # fmt: skip
