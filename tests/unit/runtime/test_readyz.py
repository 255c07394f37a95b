"""/readyz names the dependency that is down with a fixed word, never the exception's text;
the text goes to the log instead (at warning once a minute per check)."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from starlette.applications import Starlette

from eventos.runtime import build, service
from eventos.runtime.service import health_routes

SECRET_DETAIL = 'connection to "pg.internal" user "eventos" password "hunter2" failed'


async def ok() -> None:
    return None


async def database_down() -> None:
    raise OSError(SECRET_DETAIL)


async def temporal_hangs() -> None:
    await asyncio.Event().wait()  # never answers; the readiness check's timeout ends it


async def readyz(checks: dict[str, service.ReadinessCheck]) -> httpx.Response:
    app = Starlette(routes=health_routes("ingress", checks))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get("/readyz")


async def test_readyz_names_the_failed_checks_with_a_fixed_word(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(service, "READINESS_TIMEOUT_S", 0.05)
    caplog.set_level(logging.DEBUG, logger="eventos.runtime.service")
    checks = {"database": database_down, "temporal": temporal_hangs, "wake": ok}
    answer = await readyz(checks)
    assert answer.status_code == 503
    assert answer.json() == {
        "service": "ingress",
        "ready": False,
        "failed": {"database": "unavailable", "temporal": "timeout"},
        "release": build.running_release().as_json(),  # which code says so
    }
    assert "hunter2" not in answer.text and "OSError" not in answer.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("database" in m and SECRET_DETAIL in m for m in warnings), warnings
    assert any("temporal" in m and "timeout" in m for m in warnings), warnings


async def test_a_failing_check_logs_at_warning_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="eventos.runtime.service")
    app_checks = {"database": database_down}
    app = Starlette(routes=health_routes("relay", app_checks))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for _ in range(3):
            assert (await client.get("/readyz")).json()["failed"] == {"database": "unavailable"}
    levels = [r.levelno for r in caplog.records if "readiness check database" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


async def test_readyz_is_ready_when_every_check_passes() -> None:
    answer = await readyz({"database": ok})
    assert (answer.status_code, answer.json()["failed"]) == (200, {})
