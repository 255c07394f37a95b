"""Shared wiring for services that hold a database pool and a Temporal connection.

Each such service appends its own loops to the returned Service before running it.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn, open_pool
from eventos.runtime.service import Service
from eventos.runtime.temporal import TemporalConnection
from eventos.runtime.wake import WakeServicer, WakeSignal
from eventos.settings import DatabaseSettings, ServiceSettings, TemporalSettings
from eventos.v1 import wake_pb2_grpc


@dataclass
class ConnectedConfig:
    """Settings of a service that talks to PostgreSQL and Temporal."""

    name: str
    database: DatabaseSettings
    temporal: TemporalSettings
    service: ServiceSettings
    wake: bool = False

    @classmethod
    def from_env(cls, name: str, *, wake: bool = False) -> ConnectedConfig:
        return cls(
            name=name,
            database=DatabaseSettings.from_env(),
            temporal=TemporalSettings.from_env(),
            service=ServiceSettings.from_env(name),
            wake=wake,
        )


@dataclass
class Connected:
    """What such a service's loops receive."""

    pool: AsyncConnectionPool[Conn]
    temporal: TemporalConnection
    signal: WakeSignal


async def build_connected(cfg: ConnectedConfig) -> tuple[Service, Connected]:
    """The service (health, optional Wake endpoint) and its connections."""
    # Autocommit: these services' multi-statement work is all in explicit transactions.
    pool: AsyncConnectionPool[Conn] = await open_pool(cfg.database, wait=False, autocommit=True)
    temporal = TemporalConnection(cfg.temporal)
    signal = WakeSignal()

    async def database_ready() -> None:
        async with pool.connection(timeout=1.5) as conn:
            await conn.execute("SELECT 1")

    registrars = []
    if cfg.wake:
        servicer = WakeServicer(signal)
        registrars.append(lambda s: wake_pb2_grpc.add_WakeServicer_to_server(servicer, s))
    service = Service(
        name=cfg.name,
        host=cfg.service.host,
        http_port=cfg.service.http_port,
        grpc_port=cfg.service.grpc_port if cfg.wake else None,
        checks={"database": database_ready, "temporal": temporal.ready},
        grpc_registrars=registrars,
        on_stop=[pool.close],
    )
    return service, Connected(pool, temporal, signal)
