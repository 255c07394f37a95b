"""The supervision watchdogs (SPEC §12) on real PostgreSQL and the dev server: a stalled router,
a full window while its entity is idle, and stuck retries (an intent, a send), each raising its
item and resolving it when its condition clears. The pass takes `now`: the tests move it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from channel_stack import Stack, egress_running, telegram_stack
from psycopg_pool import AsyncConnectionPool
from test_router import append_all, driver_event, query, route_until_done

from eventos import names
from eventos.control.intent_deliverer import Deliverer
from eventos.db import Conn
from eventos.delivery.relay import Relay
from eventos.employees import intents
from eventos.health.loop import supervise_once
from eventos.llm.endpoints import LlmEndpoints
from eventos.local.ports import free_port
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.payload_guard import connect
from eventos.runtime.temporal import TemporalConnection
from eventos.settings import DatabaseSettings, SupervisionSettings, TemporalSettings
from eventos.testing import wait_for
from eventos.workers.activities import DbActivities
from eventos.workers.roles import workflow_worker

pytestmark = pytest.mark.temporal
CFG = SupervisionSettings()


async def items(pool: AsyncConnectionPool[Conn], kind: str) -> list[dict[str, Any]]:
    q = "SELECT * FROM attention_items WHERE kind = %s ORDER BY id"
    return await query(pool, q, kind)


async def test_a_stalled_router_raises_its_item_and_it_resolves_once_routed(
    started: str, pool: AsyncConnectionPool[Conn]
) -> None:
    await append_all(pool, [driver_event("alice", 1)])
    now = datetime.now(UTC)
    await supervise_once(pool, None, CFG, now=now)
    assert await items(pool, names.ATTENTION_ROUTER_STALLED) == []  # 30 s are not over
    for later in (31, 45):  # raised once; while it lasts it is refreshed, not counted again
        done = await supervise_once(pool, None, CFG, now=now + timedelta(seconds=later))
        assert done.watched.open[names.ATTENTION_ROUTER_STALLED] == ["router"]
    (item,) = await items(pool, names.ATTENTION_ROUTER_STALLED)
    assert (item["employee"], item["ref"], item["state"], item["count"], item["severity"]) == (
        names.INSTANCE_ITEMS, "router", "open", 1, "error")  # fmt: skip
    assert "is the router running" in item["detail"]
    await route_until_done(pool)
    await supervise_once(pool, None, CFG, now=now + timedelta(seconds=46))
    (item,) = await items(pool, names.ATTENTION_ROUTER_STALLED)
    assert item["state"] == "resolved"


async def test_a_full_window_while_its_entity_is_idle_raises_its_item_until_a_turn_runs(
    started: str, pool: AsyncConnectionPool[Conn], temporal_settings: TemporalSettings,
    outbox_keys: OutboxKeys,
) -> None:  # fmt: skip
    await append_all(pool, [driver_event("alice", n) for n in range(40)])
    await route_until_done(pool)
    queue = f"wf-{uuid.uuid4().hex[:8]}"  # no worker yet: the entity takes nothing
    relay = Relay(pool, TemporalConnection(temporal_settings), "relay-w", task_queue=queue)
    while await relay.pass_once():
        pass
    (stream,) = await query(pool, "SELECT stream_key, hold_reason FROM bus_streams")
    assert stream["hold_reason"] == names.HOLD_WINDOW
    now = datetime.now(UTC)
    await supervise_once(pool, None, CFG, now=now + timedelta(minutes=1))
    assert await items(pool, names.ATTENTION_WINDOW_STALLED) == []  # not idle long enough
    await supervise_once(pool, None, CFG, now=now + timedelta(minutes=6))
    (item,) = await items(pool, names.ATTENTION_WINDOW_STALLED)
    assert (item["employee"], item["ref"], item["state"]) == (started, stream["stream_key"], "open")
    assert "32 inputs" in item["detail"]
    client = await connect(temporal_settings.address, temporal_settings.namespace)
    async with workflow_worker(client, queue, DbActivities(pool, outbox=outbox_keys)):

        async def turn_running() -> bool:
            return bool(await query(pool, "SELECT 1 FROM turns WHERE status = 'running'"))

        await wait_for(turn_running, timeout=30, what="the entity's turn running")
        await supervise_once(pool, None, CFG, now=now + timedelta(minutes=6))
    (item,) = await items(pool, names.ATTENTION_WINDOW_STALLED)
    assert item["state"] == "resolved"


async def test_an_intent_retrying_past_its_threshold_is_a_stuck_retry_until_it_applies(
    pool: AsyncConnectionPool[Conn], temporal_settings: TemporalSettings, outbox_keys: OutboxKeys
) -> None:
    cfg = SupervisionSettings(stuck_intent_attempts=2)
    async with pool.connection() as conn:
        intent = await intents.rearm(conn)
    away = TemporalSettings(address=f"127.0.0.1:{free_port()}", namespace="default")
    failing = Deliverer(pool, TemporalConnection(away), outbox=outbox_keys)

    async def tried_twice() -> bool:
        await failing.pass_once()
        rows = await query(pool, "SELECT attempts FROM intents WHERE id = %s", intent["id"])
        return int(rows[0]["attempts"]) >= 2

    await wait_for(tried_twice, timeout=30, interval=0.5, what="two failed attempts")
    done = await supervise_once(pool, None, cfg)
    ref = f"intent:{intent['id']}"
    assert done.watched.open[names.ATTENTION_STUCK_RETRY] == [ref]
    (item,) = await items(pool, names.ATTENTION_STUCK_RETRY)
    assert (item["employee"], item["ref"], item["state"]) == (names.INSTANCE_ITEMS, ref, "open")
    assert "rearm" in item["detail"] and "connect" in item["detail"].lower()
    working = Deliverer(pool, TemporalConnection(temporal_settings), outbox=outbox_keys,
                        workflow_queue=f"wf-{uuid.uuid4().hex[:8]}")  # fmt: skip
    await wait_for(working.pass_once, timeout=30, interval=0.5, what="the intent applied")
    await supervise_once(pool, None, cfg)
    (item,) = await items(pool, names.ATTENTION_STUCK_RETRY)
    assert item["state"] == "resolved"


@pytest.fixture
async def stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints) as s:  # fmt: skip
        yield s


async def test_a_send_the_provider_keeps_deferring_is_a_stuck_retry_until_it_is_sent(
    stack: Stack,
) -> None:
    s = stack
    cfg = SupervisionSettings(stuck_send_attempts=3)
    s.fake.fail_next(s.token, 1000, 429, "Too Many Requests: retry after 1", {"retry_after": 1})
    async with egress_running(s):
        s.fake.customer_message(s.token, 818181, "anyone there")

        async def claimed_thrice() -> dict[str, Any] | None:
            rows = await s.outbox()
            return rows[0] if rows and rows[0]["attempts"] >= 3 else None

        row = await wait_for(claimed_thrice, timeout=60, interval=0.2, what="three claims")
        done = await supervise_once(s.pool, None, cfg)
        ref = f"outbox#{row['id']}"
        assert ref in done.watched.open[names.ATTENTION_STUCK_RETRY]
        (item,) = await s.attention(names.ATTENTION_STUCK_RETRY)
        assert (item["ref"], item["state"]) == (ref, "open")
        assert "keeps deferring" in item["detail"] and "818181" not in item["detail"]
        s.fake.faults[(s.token, "sendmessage")].clear()  # the provider takes it again
        await s.one_outbox("sent")
    await supervise_once(s.pool, None, cfg)
    (item,) = await s.attention(names.ATTENTION_STUCK_RETRY)
    assert item["state"] == "resolved"
