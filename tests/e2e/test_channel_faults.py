"""Telegram under faults, the six services as processes (issue 14): the ingress SIGKILLed
between a page's commit and the call that confirms it to Telegram, and the Temporal server
stopped for 60 s while customers write and webhooks keep arriving (scenario (g), shortened)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from conftest import E2E_TIMEOUT_S, SECRETS
from fake_telegram import FakeTelegram
from stack import Owner, Stack, base_env, one, own_dev_server, rows, until

from eventos import names
from eventos.local.temporal_dev import TemporalDevServer
from eventos.settings import DatabaseSettings, TemporalSettings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

T = TypeVar("T")
NAME = "shop"
ACCOUNT = "tg-shop"
SOURCE = f"telegram:{ACCOUNT}"
OUTAGE_S = 60.0
DRAIN_S = 180.0

SPEC = f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {NAME}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}, system: You help.}}]
  triggers:
    - {{kind: telegram, account: {ACCOUNT}}}
    - {{kind: webhook, path: ops, verify: {{scheme: none}}, dedupe_header: X-Event-Id,
       thread_by: event}}
"""


class FakeInThread:
    """The Bot API fake on its own event loop in a thread; its hooks run on that loop."""

    def __init__(self) -> None:
        self.fake = FakeTelegram()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeInThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(15)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(15)
        self.loop.close()

    def call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """`fn(*args, **kw)` on the fake's loop (its hooks are not thread-safe)."""

        async def run() -> T:
            return fn(*args, **kw)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(15)


@pytest.fixture
def telegram() -> Iterator[FakeInThread]:
    with FakeInThread() as running:
        yield running


@pytest.fixture
def temporal(tmp_path: Path) -> Iterator[TemporalDevServer]:
    """A dev server of this test's own: the test stops it."""
    with own_dev_server(tmp_path / "temporal") as server:
        yield server


@pytest.fixture
def bot(telegram: FakeInThread) -> str:
    return telegram.call(telegram.fake.add_bot, "shop_bot")


def telegram_env(database_url: str, temporal: TemporalSettings, telegram: FakeInThread,
                 bot: str, blobs: Path) -> dict[str, str]:  # fmt: skip
    """The services' environment with the bot on the fake's Bot API, polled briefly."""
    env = base_env(database_url, temporal.address, temporal.namespace, blobs)
    env.update(SECRETS)
    env.update({
        "EVENTOS_SECRET_TG_SHOP": bot, "EVENTOS_CHANNELS_TELEGRAM_API": telegram.fake.base_url,
        "EVENTOS_CHANNELS_POLL_TIMEOUT_S": "2", "EVENTOS_CHANNELS_REFRESH_S": "1",
        "EVENTOS_CHANNELS_LEASE_TTL_S": "5",
    })  # fmt: skip
    return env


@pytest.fixture
def stack(db_settings: DatabaseSettings, temporal: TemporalDevServer, telegram: FakeInThread,
          bot: str, tmp_path: Path) -> Iterator[Stack]:  # fmt: skip
    settings = TemporalSettings(temporal.address, temporal.namespace)
    env = telegram_env(db_settings.url, settings, telegram, bot, tmp_path / "blobs")
    with Stack(env, tmp_path) as running:
        Owner(running.ingress_url).apply_and_start(SPEC, NAME)
        yield running


def account_up(url: str) -> bool:
    found = rows(url, "SELECT status FROM channel_accounts WHERE id = %(id)s", {"id": SOURCE})
    return bool(found) and found[0]["status"] == "up"


def updates_in_inbox(url: str) -> list[str]:
    found = rows(url, "SELECT dedupe_key FROM bus_ingress WHERE source_key = %(s)s ORDER BY id",
                 {"s": SOURCE})  # fmt: skip
    return [r["dedupe_key"] for r in found]


def test_an_ingress_killed_between_commit_and_confirm_reads_the_update_once(
    stack: Stack, telegram: FakeInThread, bot: str, db_settings: DatabaseSettings
) -> None:
    url, fake = db_settings.url, telegram.fake
    until(lambda: account_up(url), 30, "the account read", stack)
    telegram.call(fake.hold, bot)  # the next getUpdates parks before it confirms anything
    update = telegram.call(fake.customer_message, bot, 3131, "is my order on its way?")
    until(lambda: updates_in_inbox(url) == [f"update:{update['update_id']}"], 30,
          "the update committed", stack)  # fmt: skip
    until(lambda: telegram.call(fake.held, bot), 30, "the confirming call at Telegram", stack)
    assert telegram.call(fake.confirmed_offset, bot) <= update["update_id"]

    stack["ingress"].kill()  # between the commit and the offset reaching Telegram
    telegram.call(fake.release, bot, drop=True)  # the parked call dies with its process
    assert telegram.call(fake.pending, bot) == [update]  # Telegram still offers it
    stack["ingress"].start()  # its lease expires; the new reader asks from the cursor

    until(lambda: telegram.call(fake.confirmed_offset, bot) > update["update_id"], 60,
          "the update confirmed", stack)  # fmt: skip
    until(lambda: telegram.call(fake.sent, bot, 3131), 60, "the reply", stack)
    assert updates_in_inbox(url) == [f"update:{update['update_id']}"]  # once, never twice
    assert one(url, "SELECT count(*) FROM bus_deliveries WHERE status = 'done'") == 1
    assert len(telegram.call(fake.sent, bot, 3131)) == 1


def hook(ingress_url: str) -> str:
    event_id = uuid.uuid4().hex
    answer = httpx.post(f"{ingress_url}/hooks/ops", json={"kind": "nightly"},
                        headers={"X-Event-Id": event_id}, timeout=5)  # fmt: skip
    assert answer.status_code == 200, answer.text
    return event_id


def test_temporal_down_for_60_s_keeps_reading_and_answering_and_drains_customers_first(
    stack: Stack, telegram: FakeInThread, bot: str, temporal: TemporalDevServer,
    db_settings: DatabaseSettings,
) -> None:  # fmt: skip
    url, fake = db_settings.url, telegram.fake
    until(lambda: account_up(url), 30, "the account read", stack)
    temporal.stop()
    began, n, hooks, offsets = time.monotonic(), 0, [], []
    while time.monotonic() - began < OUTAGE_S:
        telegram.call(fake.customer_message, bot, 4000 + n % 5, f"hello {n}")
        hooks.append(hook(stack.ingress_url))  # answered 200 at once (I2)
        offsets.append(telegram.call(fake.confirmed_offset, bot))
        n += 1
        time.sleep(max(0.0, began + n * 2.0 - time.monotonic()))  # paces the customers
    # Reading never needed Temporal: every update was appended and confirmed as it came.
    until(lambda: len(telegram.call(fake.pending, bot)) == 0, 30, "every update read", stack)
    assert offsets == sorted(offsets) and offsets[-1] > offsets[0]
    assert len(updates_in_inbox(url)) == n
    assert one(url, "SELECT count(*) FROM turns") == 0
    restarted = one(url, "SELECT now()")
    temporal.start()

    def drained() -> bool:
        open_ = one(url, "SELECT count(*) FROM bus_deliveries WHERE status <> 'done'")
        return open_ == 0 and one(url, "SELECT count(*) FROM sched_leases") == 0

    until(drained, DRAIN_S, "the backlog drained", stack)
    answered = {m["chat"]["id"] for m in telegram.call(fake.sent, bot)}
    assert answered == {4000 + i for i in range(5)}  # every customer answered
    assert one(url, "SELECT count(*) FROM outbound_messages WHERE status <> 'sent'") == 0
    # Customers (C2) before the webhooks (C4): after the restart every entity asks for a slot
    # at once; the customers' turns are admitted in the first wave (at most the per-employee
    # cap of C4 turns before them) and answered before the C4 backlog is worked through.
    after = rows(url, "SELECT class, started_at, ended_at FROM turns WHERE started_at > %(t)s "
                      "ORDER BY started_at", {"t": restarted})  # fmt: skip
    order = [t["class"] for t in after]
    assert order.count(4) > names.EMPLOYEE_TURN_CAP, order  # a backlog that had to wait
    assert order.index(2) <= names.EMPLOYEE_TURN_CAP, order
    customers_answered = max(t["ended_at"] for t in after if t["class"] == 2)
    assert customers_answered < max(t["ended_at"] for t in after if t["class"] == 4), after
