"""Services whose main loop comes later still start, connect, report ready and stop cleanly."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from conftest import run_service

from eventos.local.ports import free_port
from eventos.runtime.wiring import ConnectedConfig, build_connected
from eventos.settings import DatabaseSettings, ServiceSettings, TemporalSettings
from eventos.v1 import wake_pb2, wake_pb2_grpc

pytestmark = pytest.mark.temporal


@pytest.mark.parametrize("name", ["relay", "workers-workflow", "workers-llm", "egress"])
async def test_connected_service_is_ready_with_database_and_temporal(
    name: str, db_settings: DatabaseSettings, temporal_settings: TemporalSettings
) -> None:
    cfg = ConnectedConfig(
        name, db_settings, temporal_settings, ServiceSettings(name), wake=name == "relay"
    )
    service, _ = await build_connected(cfg)
    task = await run_service(service)
    base = f"http://127.0.0.1:{service.bound_http_port}"
    async with httpx.AsyncClient(base_url=base) as client:
        assert (await client.get("/livez")).status_code == 200
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        metrics = await client.get("/metrics")
        assert "eventos_event_loop_lag_seconds" in metrics.text
    service.stop()
    await asyncio.wait_for(task, 10)


async def test_without_temporal_it_is_alive_but_not_ready(db_settings: DatabaseSettings) -> None:
    nowhere = TemporalSettings(address=f"127.0.0.1:{free_port()}")
    cfg = ConnectedConfig("relay", db_settings, nowhere, ServiceSettings("relay"), wake=True)
    service, connected = await build_connected(cfg)
    task = await run_service(service)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.bound_http_port}") as client:
        assert (await client.get("/livez")).status_code == 200
        ready = await client.get("/readyz", timeout=10)
        assert ready.status_code == 503
        failed = ready.json()["failed"]
        assert set(failed) == {"temporal"}
        # A fixed word, never the client's error text (addresses, exception names).
        assert failed["temporal"] in {"unavailable", "timeout"}
    # The relay's Kick endpoint answers and wakes its loop even so.
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.bound_grpc_port}") as ch:
        await wake_pb2_grpc.WakeStub(ch).Kick(wake_pb2.KickRequest(reason="test"), timeout=5)
    assert await connected.signal.wait(1.0)
    service.stop()
    await asyncio.wait_for(task, 10)
