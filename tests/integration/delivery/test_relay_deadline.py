"""The relay's Signal-With-Start has a deadline (issue 25 point 9): a Temporal frontend that
stops answering on a live connection (the path went silent: a half-open TCP connection, a
stuck proxy) ends the call at its `rpc_timeout`, the breaker opens and nothing is committed;
without it the pass holds the stream's lease until TCP keepalive gives up (about 45 s)."""

from __future__ import annotations

import asyncio

import pytest
from psycopg_pool import AsyncConnectionPool
from test_publish_limits import FreezableProxy
from test_relay import client, employee, relay_for, stream, task_queue  # noqa: F401 (fixtures)
from test_router import append_all, driver_event, route_until_done

from eventos.db import Conn
from eventos.settings import TemporalSettings

pytestmark = pytest.mark.temporal


async def test_a_signal_with_start_temporal_never_answers_ends_at_its_deadline(
    employee: str,  # noqa: F811
    pool: AsyncConnectionPool[Conn],
    task_queue: str,  # noqa: F811
    temporal_settings: TemporalSettings,
) -> None:
    await append_all(pool, [driver_event("ivy", n) for n in range(2)])
    await route_until_done(pool)
    proxy = FreezableProxy(temporal_settings.address)
    via = TemporalSettings(address=await proxy.start(), namespace=temporal_settings.namespace)
    try:
        relay = relay_for(pool, via, task_queue, call_timeout_s=1.0)
        await relay.temporal.get()  # connected through the path that goes silent next
        proxy.frozen.set()
        served = await asyncio.wait_for(relay.pass_once(), timeout=20)
        assert served == 0 and relay.breaker.opened
        assert (await stream(pool))["delivered_seq"] == 0  # nothing committed
    finally:
        await proxy.stop()
