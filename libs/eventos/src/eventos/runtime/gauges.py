"""The figures of SPEC §12 that live in the database (backlog, oldest pending, open breakers
between employees, egress depth), read by one service each on a bounded periodic query, never
per scrape: every `GAUGE_INTERVAL_S`, each read under `GAUGE_READ_TIMEOUT_S` (and the pool's
statement timeout). A failed read logs and leaves the last figures; the next one tries again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.runtime.metrics import (
    BREAKERS_OPEN,
    EGRESS_DEPTH,
    PENDING_HELD,
    PENDING_OLDEST_AGE,
    class_label,
)

log = logging.getLogger(__name__)

GAUGE_INTERVAL_S: Final = 15.0
GAUGE_READ_TIMEOUT_S: Final = 5.0
EGRESS_STATUSES: Final = ("queued", "sending")
HOLDS: Final = frozenset(
    {names.HOLD_STARTING, names.HOLD_PAUSED, names.HOLD_WINDOW, names.GATE_BUDGET,
     names.HOLD_BACKOFF, names.HOLD_QUARANTINED, names.HOLD_DEGRADED}
)  # fmt: skip


async def read_backlog(pool: AsyncConnectionPool[Conn]) -> None:
    """The relay's gauges: oldest open delivery and held inputs per class, open edge breakers."""
    async with pool.connection(timeout=GAUGE_READ_TIMEOUT_S) as conn:
        rows = await (await conn.execute(Q["metrics_open_deliveries"])).fetchall()
        edges = await (await conn.execute(Q["metrics_edge_breakers_open"])).fetchone()
    oldest = dict.fromkeys(names.CLASSES, 0.0)
    held: dict[tuple[int, str], int] = {}
    for r in rows:
        klass = int(r["class"])
        oldest[klass] = max(oldest.get(klass, 0.0), float(r["oldest_s"]))
        if r["hold_reason"] is not None:
            hold = r["hold_reason"] if r["hold_reason"] in HOLDS else "other"
            held[klass, hold] = held.get((klass, hold), 0) + int(r["n"])
    for klass, age in oldest.items():
        PENDING_OLDEST_AGE.labels(class_label(klass)).set(age)
    for klass in names.CLASSES:  # a hold that cleared reads 0, not its last count
        for hold in HOLDS | {"other"}:
            PENDING_HELD.labels(class_label(klass), hold).set(held.get((klass, hold), 0))
    BREAKERS_OPEN.labels("employee_edge").set(int(edges["n"]) if edges else 0)


async def read_outbox(pool: AsyncConnectionPool[Conn]) -> None:
    """Egress's gauge: the outbox rows it has to send, by status."""
    async with pool.connection(timeout=GAUGE_READ_TIMEOUT_S) as conn:
        rows = await (await conn.execute(Q["metrics_outbox_depth"])).fetchall()
    depth = {str(r["status"]): int(r["n"]) for r in rows}
    for status in EGRESS_STATUSES:
        EGRESS_DEPTH.labels(status).set(depth.get(status, 0))


async def gauge_loop(
    read: Callable[[AsyncConnectionPool[Conn]], Awaitable[None]],
    pool: AsyncConnectionPool[Conn],
    interval_s: float = GAUGE_INTERVAL_S,
) -> None:
    """Run `read` now and then every `interval_s`, forever."""
    while True:
        try:
            await asyncio.wait_for(read(pool), GAUGE_READ_TIMEOUT_S)
        except Exception as exc:  # the database is down or slow: the next round tries again
            log.warning("metrics read %s failed: %s: %s", read.__name__, type(exc).__name__, exc)
        await asyncio.sleep(interval_s)
