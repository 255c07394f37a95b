"""Wiring of the router: route on a kick or every second; upkeep of partitions, dedupe and the
retention of bodies, deliveries, dead letters and the timeline."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.bus import blobs, retention
from eventos.db import Conn, open_pool
from eventos.db.migrate import drop_expired_partitions, ensure_partitions
from eventos.db.sql import Q
from eventos.delivery.routing import RouteStats, route_pass
from eventos.messaging import staleness, storm
from eventos.operator import events as operator_events
from eventos.runtime.metrics import ROUTER_DELIVERIES, ROUTER_ROWS, count_dead
from eventos.runtime.service import Service
from eventos.runtime.wake import Kicker, WakeServicer, WakeSignal
from eventos.settings import DatabaseSettings, MessagingSettings, ServiceSettings
from eventos.timeline import entries as timeline
from eventos.v1 import wake_pb2_grpc

log = logging.getLogger(__name__)
NAME = "router"
UPKEEP_INTERVAL_S = 3600.0


@dataclass
class RouterConfig:
    """Everything the router needs, passed in."""

    database: DatabaseSettings
    service: ServiceSettings
    messaging: MessagingSettings = field(default_factory=MessagingSettings)

    @classmethod
    def from_env(cls) -> RouterConfig:
        return cls(DatabaseSettings.from_env(), ServiceSettings.from_env(NAME),
                   MessagingSettings.from_env())  # fmt: skip


def count(stats: RouteStats) -> None:
    ROUTER_ROWS.labels(names.INGRESS_ROUTED).inc(stats.routed)
    ROUTER_ROWS.labels(names.INGRESS_NO_CONSUMER).inc(stats.no_consumer)
    ROUTER_ROWS.labels(names.INGRESS_DEAD).inc(stats.dead)
    ROUTER_DELIVERIES.inc(stats.deliveries)
    for reason in stats.dead_reasons:
        count_dead(reason)


async def route_loop(
    pool: AsyncConnectionPool[Conn], signal: WakeSignal, kicker: Kicker | None, poll_s: float,
    owner: bool | None = None,
) -> None:  # fmt: skip
    """Route until nothing is accepted, then wait for a kick or the poll interval (`owner`:
    the sources holding owner rows only, or the others only; see `route_pass`)."""
    while True:
        try:
            async with pool.connection() as conn:
                stats = await route_pass(conn, owner=owner)
            count(stats)
            if stats.deliveries and kicker is not None:
                kicker.kick()
            if stats.rows:
                continue
        except Exception:
            log.exception("routing pass failed; retrying after the poll interval")
        await signal.wait(poll_s)


async def upkeep_loop(pool: AsyncConnectionPool[Conn]) -> None:
    """Partitions ahead; expired partitions (their dead rows kept), dedupe keys, deliveries,
    dead letters, bodies, timeline entries and operator events gone (SPEC §5, §15)."""
    while True:
        try:
            async with pool.connection() as conn:
                await conn.set_autocommit(True)
                today = datetime.now(UTC).date()
                await ensure_partitions(conn, today)
                await drop_expired_partitions(
                    conn, today, retention_days=names.INGRESS_RETENTION_DAYS
                )
                await conn.execute(Q["dedupe_expire"])
                await retention.expire_deliveries(conn)
                await retention.expire_dead_ingress(conn)
                while await blobs.expire(conn) > 0:
                    pass
                await timeline.expire(conn)
                await operator_events.expire(conn)
        except Exception:
            log.exception("upkeep failed; next try in an hour")
        await asyncio.sleep(UPKEEP_INTERVAL_S)


async def messaging_loop(pool: AsyncConnectionPool[Conn], settings: MessagingSettings,
                         every_s: float = names.IPC_UPKEEP_EVERY_S) -> None:  # fmt: skip
    """The storm guards' due digests and the messages and tasks undelivered past their bound,
    every few seconds (SPEC §10, §15; task deadlines are alarms, fired by the delegator's
    supervisor)."""
    while True:
        try:
            async with pool.connection() as conn:
                digests = await storm.flush_due(conn, datetime.now(UTC))
                expired = await staleness.expire_undelivered(
                    conn, datetime.now(UTC), settings.stale_after_s
                )
            if digests or expired:
                log.info("messaging upkeep: %d digests, %d expired", digests, expired)
        except Exception:
            log.exception("messaging upkeep failed; next try in %.0f s", every_s)
        await asyncio.sleep(every_s)


async def build(cfg: RouterConfig) -> Service:
    """The router service, ready to run."""
    pool: AsyncConnectionPool[Conn] = await open_pool(cfg.database, wait=False)
    signal = WakeSignal()
    kicker = Kicker(cfg.service.kick_targets, reason="route") if cfg.service.kick_targets else None

    async def database_ready() -> None:
        async with pool.connection(timeout=1.5) as conn:
            await conn.execute("SELECT 1")

    async def stop() -> None:
        if kicker is not None:
            await kicker.stop()
        await pool.close()

    if kicker is not None:
        kicker.start()
    servicer = WakeServicer(signal)
    # The owner's lane and the others', side by side, each waking on a fork of the kick.
    routing = [partial(route_loop, pool, signal.fork(), kicker, cfg.service.poll_interval_s, owner)
               for owner in (True, False)]  # fmt: skip
    return Service(
        name=NAME,
        host=cfg.service.host,
        http_port=cfg.service.http_port,
        grpc_port=cfg.service.grpc_port,
        checks={"database": database_ready},
        grpc_registrars=[lambda s: wake_pb2_grpc.add_WakeServicer_to_server(servicer, s)],
        loops=[
            *routing,
            lambda: upkeep_loop(pool),
            lambda: messaging_loop(pool, cfg.messaging),
        ],
        on_stop=[stop],
    )
