"""Services whose main loop comes later still start, connect, report ready and stop cleanly, and
name the release they run on /livez, /readyz and /metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from conftest import run_service

from eventos import settings
from eventos.db.migrate import shipped_migrations
from eventos.local.ports import free_port
from eventos.runtime import build
from eventos.runtime.wiring import ConnectedConfig, build_connected
from eventos.settings import DatabaseSettings, ServiceSettings, TemporalSettings
from eventos.v1 import wake_pb2, wake_pb2_grpc

pytestmark = pytest.mark.temporal
DEPLOYED = {  # what the chart sets (tests/deploy/test_chart_instance.py)
    settings.IMAGE_TAG_VAR: "2026.12.1",
    settings.CHART_VERSION_VAR: "0.4.2",
    settings.TEMPORAL_SERVER_VAR: "temporalio/server:1.32.0",
}


@pytest.mark.parametrize("name", ["relay", "workers-workflow", "workers-llm", "egress"])
async def test_connected_service_is_ready_with_database_and_temporal(
    name: str,
    db_settings: DatabaseSettings,
    temporal_settings: TemporalSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var, value in DEPLOYED.items():
        monkeypatch.setenv(var, value)
    cfg = ConnectedConfig(
        name, db_settings, temporal_settings, ServiceSettings(name), wake=name == "relay"
    )
    service, _ = await build_connected(cfg)
    task = await run_service(service)
    base = f"http://127.0.0.1:{service.bound_http_port}"
    async with httpx.AsyncClient(base_url=base) as client:
        live = await client.get("/livez")
        assert live.status_code == 200
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        expected = {
            "version": build.release(),
            "build": build.worker_build_id(),
            "image_tag": "2026.12.1",
            "chart": "0.4.2",
            "temporal_server": "temporalio/server:1.32.0",
            "migrations": len(shipped_migrations()),
        }
        assert live.json()["release"] == expected
        assert ready.json()["release"] == expected
        metrics = await client.get("/metrics")
        assert "eventos_event_loop_lag_seconds" in metrics.text
        labels = (f'service="{name}"', 'image_tag="2026.12.1"', 'chart="0.4.2"',
                  f'migrations="{len(shipped_migrations())}"')  # fmt: skip
        infos = [
            line for line in metrics.text.splitlines() if line.startswith("eventos_build_info{")
        ]
        assert any(all(label in line for label in labels) for line in infos), infos
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
        assert ready.json()["release"]["build"] == build.worker_build_id()  # which code says so
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
