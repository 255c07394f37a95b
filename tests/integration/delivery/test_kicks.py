"""Kicks after commit: ingress wakes the router, the router wakes the relay; polls back them up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from conftest import ADMIN_TOKEN, SECRETS, run_service
from eventos_ingress.app import IngressConfig
from eventos_ingress.app import build as build_ingress
from eventos_router.app import RouterConfig
from eventos_router.app import build as build_router
from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn
from eventos.runtime.service import Service
from eventos.runtime.wiring import Connected, ConnectedConfig, build_connected
from eventos.settings import (
    AdminSettings,
    DatabaseSettings,
    IngressBuffers,
    SecretStore,
    ServiceSettings,
    TemporalSettings,
)
from eventos.testing import wait_for

NEVER = 3600.0  # a poll interval no test waits for


async def delivered(pool: AsyncConnectionPool[Conn]) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM bus_deliveries")
        return int((await cur.fetchone() or {})["n"])


class Stack:
    """Relay ← router ← ingress, in this process, each kicking the next."""

    def __init__(self) -> None:
        self.services: list[tuple[Service, asyncio.Task[None]]] = []
        self.relay: Connected | None = None

    async def add(self, service: Service) -> Service:
        self.services.append((service, await run_service(service)))
        return service

    async def close(self) -> None:
        for service, task in reversed(self.services):
            service.stop()
            await asyncio.wait_for(task, 15)


@pytest.fixture
async def stack(
    db_settings: DatabaseSettings, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Stack, str]]:
    router_poll: float = getattr(request, "param", NEVER)
    s = Stack()
    relay_cfg = ConnectedConfig(
        "relay", db_settings, TemporalSettings(), ServiceSettings("relay"), wake=True
    )
    relay, s.relay = await build_connected(relay_cfg)
    await s.add(relay)
    router_settings = ServiceSettings(
        "router", kick_targets=(f"127.0.0.1:{relay.bound_grpc_port}",)
    )
    router = await s.add(
        await build_router(
            RouterConfig(db_settings, replace(router_settings, poll_interval_s=router_poll))
        )
    )
    ingress_cfg = IngressConfig(
        database=db_settings,
        service=ServiceSettings("ingress", kick_targets=(f"127.0.0.1:{router.bound_grpc_port}",)),
        admin=AdminSettings(ADMIN_TOKEN),
        secrets=SecretStore(env=SECRETS),
        buffers=IngressBuffers(tmp_path / "spool"),
    )
    ingress = await s.add(await build_ingress(ingress_cfg))
    try:
        yield s, f"http://127.0.0.1:{ingress.bound_http_port}"
    finally:
        await s.close()


async def test_a_webhook_is_routed_on_the_kick_and_the_relay_is_kicked(
    stack: tuple[Stack, str], started: str, pool: AsyncConnectionPool[Conn]
) -> None:
    s, url = stack
    assert s.relay is not None
    async with httpx.AsyncClient(base_url=url) as client:
        r = await client.post("/hooks/internal", content=b"{}", headers={"X-Event-Id": "k1"})
        assert r.status_code == 200
    # The router polls only hourly here: only the kick can have woken it.
    await wait_for(lambda: delivered(pool), timeout=10, what="delivery written")
    assert await s.relay.signal.wait(5.0), "the router did not kick the relay"


@pytest.mark.parametrize("stack", [0.2], indirect=True)
async def test_without_kicks_the_poll_routes(
    stack: tuple[Stack, str], started: str, pool: AsyncConnectionPool[Conn]
) -> None:
    from eventos.bus.inbox import IngressRecord, append

    # An append that kicks nobody (as after a lost kick).
    async with pool.connection() as conn:
        await append(
            conn,
            [IngressRecord("webhook:internal", "quiet", "eventos.webhook.received", "c", {}, 2)],
        )
    await wait_for(lambda: delivered(pool), timeout=10, what="delivery written by the poll")
