"""The Telegram stack the channel tests run on: the Bot API fake, the ingress in this process
with its channel readers, workers on the test dev server, the egress and the relay's loops."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from conftest import ADMIN_TOKEN, SECRETS, apply_and_start, ingress_config, run_service
from fake_telegram import FakeTelegram
from psycopg_pool import AsyncConnectionPool
from test_router import query
from test_turns import IDLE_S, PRICES, ROLL_AFTER, local_spec, pump

from eventos.channels.senders import Sender
from eventos.channels.settings import ChannelSettings
from eventos.channels.telegram import TelegramApi, TelegramSender
from eventos.console.settings import ConsoleSettings
from eventos.control.intent_deliverer import Deliverer
from eventos.db import Conn
from eventos.delivery.relay import Relay
from eventos.llm.activity import LlmActivities
from eventos.llm.endpoints import LlmEndpoints
from eventos.llm.worker import llm_worker
from eventos.outbox.egress import Egress, retry_loop
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.payload_guard import connect
from eventos.runtime.service import Service, cancel_and_wait
from eventos.runtime.temporal import TemporalConnection
from eventos.settings import DatabaseSettings, SecretStore, TemporalSettings, TurnTimeouts
from eventos.testing import wait_for
from eventos.workers.activities import DbActivities
from eventos.workers.roles import egress_worker, workflow_worker

STOP_S = 30.0
# A send attempt's timeout, and so its claim's life: a send whose worker died is taken over
# this long after its claim, not 30 s (the senders' own timeout is 5 s here).
TIMEOUTS = TurnTimeouts(send_s=15.0)
T = TypeVar("T")


def now(fn: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    """A synchronous check (the fake's records, on this loop) as `wait_for` takes it."""

    async def check() -> T:
        return fn()

    return check


class GatedRelay(Relay):
    """The relay, serving streams only while `consuming` is set (a test stops the employees'
    progress with it: inputs are still routed, never delivered)."""

    consuming: asyncio.Event

    async def pass_once(self) -> int:
        if not self.consuming.is_set():
            return 0
        return await super().pass_once()


def telegram_spec(name: str, extra: str = "", tools: tuple[str, ...] = ()) -> str:
    """An employee answering one Telegram account (`extra`: more of its spec body; `tools`:
    its agent's tools)."""
    spec = local_spec(name, f"    - {{kind: telegram, account: tg-{name}}}\n") + extra
    if tools:
        spec = spec.replace(
            "name: scripted}}]", f"name: scripted}}, tools: [{', '.join(tools)}]}}]"
        )
    return spec


@dataclass
class Stack:
    name: str
    fake: FakeTelegram
    token: str
    pool: AsyncConnectionPool[Conn]
    api: httpx.AsyncClient
    egress: Egress
    db: DbActivities
    queue: str
    client: Any
    ingress_config: Any
    consuming: asyncio.Event

    @property
    def source(self) -> str:
        return f"telegram:tg-{self.name}"

    async def outbox(self) -> list[dict[str, Any]]:
        sql = f"SELECT * FROM outbound_messages WHERE employee = '{self.name}' ORDER BY id"
        return await query(self.pool, sql)

    async def attention(self, kind: str) -> list[dict[str, Any]]:
        sql = (f"SELECT * FROM attention_items WHERE employee = '{self.name}' "
               f"AND kind = '{kind}' ORDER BY id")  # fmt: skip
        return await query(self.pool, sql)

    async def one_outbox(self, status: str) -> dict[str, Any]:
        async def settled() -> dict[str, Any] | None:
            rows = await self.outbox()
            return rows[0] if rows and rows[0]["status"] == status else None

        return await wait_for(settled, timeout=60, interval=0.1, what=f"an outbox row {status}")


def channel_settings(fake: FakeTelegram, **overrides: Any) -> ChannelSettings:
    """Short polls and leases for tests; the buckets as documented unless overridden."""
    base = ChannelSettings(telegram_api=fake.base_url, poll_timeout_s=1, refresh_s=1,
                           lease_ttl_s=5, down_alert_s=1, send_timeout_s=5)  # fmt: skip
    return dataclasses.replace(base, **overrides)


@contextlib.asynccontextmanager
async def running_ingress(cfg: Any) -> AsyncIterator[Service]:
    from eventos_ingress.app import build

    service = await build(cfg)
    task = await run_service(service)
    try:
        yield service
    finally:
        service.stop()
        await asyncio.wait_for(task, STOP_S)


@dataclass
class Services:
    """What a channel test runs besides its provider's fake: the ingress (with the channel
    readers), the workflow and LLM workers, the relay's and deliverer's loops, the egress's
    retry loop; the egress worker is the test's to run (`egress_running`)."""

    ingress: Service
    api: httpx.AsyncClient
    egress: Egress
    db: DbActivities
    queue: str
    client: Any
    ingress_config: Any
    consuming: asyncio.Event  # cleared: the relay delivers nothing (see GatedRelay)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ingress.bound_http_port}"


Senders = Callable[[httpx.AsyncClient], dict[str, Sender]]


@contextlib.asynccontextmanager
async def channel_services(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
    *, secrets: SecretStore, channels: ChannelSettings, senders: Senders,
    console: ConsoleSettings | None = None,
) -> AsyncIterator[Services]:  # fmt: skip
    cfg = ingress_config(db_settings, tmp_path, secrets=secrets, channels=channels,
                         llm_endpoints=llm_endpoints,
                         console=console or ConsoleSettings())  # fmt: skip
    client = await connect(temporal_settings.address, temporal_settings.namespace)
    queue = f"wf-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient() as http, running_ingress(cfg) as ingress:
        egress = Egress(pool, outbox_keys, senders(http), secrets, channels)
        db = DbActivities(pool, outbox=outbox_keys, egress=egress)
        llm = LlmActivities(http, SecretStore(env={}), pool, PRICES, endpoints=llm_endpoints)
        workers = [workflow_worker(client, queue, db)]
        workers += [llm_worker(client, k, 4, llm, workflow_queue=queue) for k in (1, 2, 3, 4)]
        relay = GatedRelay(pool, TemporalConnection(temporal_settings), f"relay-{queue}",
                           task_queue=queue, entity_roll_after=ROLL_AFTER,
                           entity_idle_s=IDLE_S, turn_timeouts=TIMEOUTS)  # fmt: skip
        relay.consuming = asyncio.Event()
        relay.consuming.set()
        deliverer = Deliverer(pool, TemporalConnection(temporal_settings), workflow_queue=queue,
                              outbox=outbox_keys)  # fmt: skip
        url = f"http://127.0.0.1:{ingress.bound_http_port}"
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with contextlib.AsyncExitStack() as exits:
            for w in workers:
                await exits.enter_async_context(w)
            tasks = [asyncio.create_task(pump(pool, relay, deliverer)),
                     asyncio.create_task(retry_loop(egress, poll_s=0.2))]  # fmt: skip
            api = await exits.enter_async_context(
                httpx.AsyncClient(base_url=url, headers=headers, timeout=10)
            )
            try:
                yield Services(ingress, api, egress, db, queue, client, cfg, relay.consuming)
            finally:
                await cancel_and_wait(tasks, STOP_S)


@contextlib.asynccontextmanager
async def telegram_stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
    spec_extra: str = "", tools: tuple[str, ...] = (), console: ConsoleSettings | None = None,
    **settings: Any,
) -> AsyncIterator[Stack]:  # fmt: skip
    fake = FakeTelegram()
    await fake.start()
    token = fake.add_bot()
    name = f"c{uuid.uuid4().hex[:8]}"
    secrets = SecretStore(env={**SECRETS, f"EVENTOS_SECRET_TG_{name.upper()}": token})
    channels = channel_settings(fake, **settings)

    def senders(http: httpx.AsyncClient) -> dict[str, Sender]:
        api = TelegramApi(http, fake.base_url)
        return {"telegram": TelegramSender(api, channels.send_timeout_s)}

    try:
        async with channel_services(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                                    llm_endpoints, secrets=secrets, channels=channels,
                                    senders=senders, console=console) as s:  # fmt: skip
            await apply_and_start(pool, telegram_spec(name, spec_extra, tools))
            yield Stack(name, fake, token, pool, s.api, s.egress, s.db, s.queue, s.client,
                        s.ingress_config, s.consuming)  # fmt: skip
    finally:
        await fake.stop()


@contextlib.asynccontextmanager
async def egress_running(s: Any) -> AsyncIterator[None]:
    """The egress worker on the stack's queue, for as long as the test says."""
    async with egress_worker(s.client, s.db, s.queue):
        yield
