"""The relay's supervision pass (SPEC §12), every `pass_s` (5 s), taking `now` so tests drive
the clock: backoffs that ended go back to the relay, released threads and recovered employees
get their entities woken (a hint: a waiting entity also asks again every 10 minutes), the
employees are judged (`degraded`), and the watchdogs run. Several relays may run passes at
once: every change is a compare-and-swap, and items are unique while open.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client

from eventos.db import Conn
from eventos.db.sql import Q
from eventos.health import degraded, watchdogs
from eventos.runtime.metrics import EMPLOYEES_DEGRADED, THREADS_QUARANTINED
from eventos.runtime.temporal import TemporalConnection, wake_entities
from eventos.settings import SupervisionSettings

log = logging.getLogger(__name__)


@dataclass
class Supervised:
    """What one pass did."""

    lifted: list[str] = field(default_factory=list)
    woken: list[str] = field(default_factory=list)
    judged: degraded.Judged = field(default_factory=degraded.Judged)
    watched: watchdogs.Watched = field(default_factory=watchdogs.Watched)


async def supervise_once(pool: AsyncConnectionPool[Conn], client: Client | None,
                         cfg: SupervisionSettings, now: datetime | None = None,
                         ) -> Supervised:  # fmt: skip
    """One pass at `now`; entities are woken only with a `client`."""
    now = now or datetime.now(UTC)
    done = Supervised()
    async with pool.connection() as conn:
        cur = await conn.execute(Q["thread_backoffs_lift"], {"now": now})
        done.lifted = [str(r["stream_key"]) for r in await cur.fetchall()]
        done.judged = await degraded.judge(conn, cfg, now)
        cur = await conn.execute(Q["streams_release_not_degraded"])
        done.lifted += [str(r["stream_key"]) for r in await cur.fetchall()]
        if client is not None:
            for query in ("thread_wakes_take", "employee_wakes_take"):
                cur = await conn.execute(Q[query])
                done.woken += [str(r["entity_id"]) for r in await cur.fetchall()]
        done.watched = await watchdogs.watch(conn, cfg, now)
        row = await (await conn.execute(Q["health_counts"])).fetchone() or {}
    THREADS_QUARANTINED.set(int(row.get("quarantined", 0)))
    EMPLOYEES_DEGRADED.set(int(row.get("degraded", 0)))
    if client is not None:
        await wake_entities(client, done.woken)
    return done


async def supervise_loop(pool: AsyncConnectionPool[Conn], temporal: TemporalConnection,
                         cfg: SupervisionSettings) -> None:  # fmt: skip
    """A pass every `cfg.pass_s` until cancelled; a failed pass is logged and tried again."""
    while True:
        try:
            client = None
            try:
                client = await temporal.get()
            except Exception as exc:  # the database side still runs; wakes wait
                log.warning("supervision pass without Temporal: %s", exc)
            await supervise_once(pool, client, cfg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database away: try again next time
            log.warning("supervision pass failed: %s", exc)
        await asyncio.sleep(cfg.pass_s)
