"""The replay gate waits out a Temporal that is briefly unreachable (its Service without a ready
endpoint as the upgrade stops the services), then gives up with the last error."""

from __future__ import annotations

from typing import Any

import pytest

from eventos.fleet import replay_gate
from eventos.settings import TemporalSettings

SETTINGS = TemporalSettings(address="127.0.0.1:1", namespace="default")


def refusing(times: int, calls: list[str]) -> Any:
    async def connect(address: str, namespace: str) -> str:
        calls.append(address)
        if len(calls) <= times:
            raise RuntimeError("Failed client connect: Connection refused")
        return "client"

    return connect


async def test_a_refused_connect_is_tried_again_until_temporal_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(replay_gate, "connect", refusing(2, calls))
    monkeypatch.setattr(replay_gate, "CONNECT_RETRY_S", 0.01)
    assert await replay_gate._connected(SETTINGS) == "client"
    assert calls == ["127.0.0.1:1"] * 3


async def test_past_the_wait_the_last_error_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(replay_gate, "connect", refusing(10**6, calls))
    monkeypatch.setattr(replay_gate, "CONNECT_RETRY_S", 0.01)
    monkeypatch.setattr(replay_gate, "CONNECT_WAIT_S", 0.05)
    with pytest.raises(RuntimeError, match="Connection refused"):
        await replay_gate._connected(SETTINGS)
    assert len(calls) > 1
