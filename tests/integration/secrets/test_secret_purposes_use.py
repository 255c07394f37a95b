"""Every use of a secret re-checks its declared purpose (EVENTOS_SECRETS_PURPOSES), since the
operator's map may change after a spec is applied: a secret now declared for another purpose
is not read and nothing carries it, while the right purpose works — the http_request tool, a
poll, a model's credential, a driver's token, a channel account's credential, a webhook's
verification secret."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import signing
from channel_stack import channel_settings, telegram_spec
from conftest import (
    COURIER_DRIVER_TOKEN,
    PURPOSES,
    SECRETS,
    apply_and_start,
    ingress_config,
    run_service,
)
from eventos_ingress.credentials import Driver, DriverTable
from fake_telegram import FakeTelegram
from grpc_calls import COURIER
from loopback_http import Answer, Loopback, http_employee, loopback
from poll_endpoint import PollEndpoint
from psycopg_pool import AsyncConnectionPool
from temporalio.exceptions import ApplicationError
from test_poll_cycle import employee as poll_employee
from test_router import query
from test_tools import call

from eventos import names
from eventos.channels.readers import ChannelReaders
from eventos.channels.telegram import TelegramApi, TelegramReader
from eventos.contracts import ModelRef
from eventos.db import Conn
from eventos.llm.endpoints import Endpoint, LlmEndpoints
from eventos.llm.providers import provider_for
from eventos.polls.cycle import Poller
from eventos.polls.fetch import http_client
from eventos.runtime.service import Service, cancel_and_wait
from eventos.secret_purposes import VAR as PURPOSES_VAR
from eventos.settings import DatabaseSettings, HttpToolSettings, OutboundSettings, SecretStore
from eventos.testing import wait_for
from eventos.tools import http
from eventos.tools.runner import ToolRunner


def redeclared(ref: str, purpose: str, **secrets: str) -> SecretStore:
    """The test operator's store after `ref` was declared for `purpose` instead."""
    entries = [e for e in PURPOSES.split() if not e.startswith(f"{ref}=")]
    return SecretStore(
        env={**SECRETS, **secrets, PURPOSES_VAR: " ".join([*entries, f"{ref}={purpose}"])}
    )


RIGHT = SecretStore(env={**SECRETS, "EVENTOS_SECRET_ORDERS_API": "orders-token-123",
                         "EVENTOS_SECRET_FEED_TOKEN": "feed-token-value"})  # fmt: skip


@pytest.fixture
def server() -> Iterator[Loopback]:
    with loopback() as s:
        yield s


async def test_http_request_sends_a_credential_only_for_its_host_purpose(
    pool: AsyncConnectionPool[Conn], server: Loopback
) -> None:
    name = f"h{uuid.uuid4().hex[:8]}"
    await apply_and_start(
        pool, http_employee(name, "[{host: 127.0.0.1, auth: {scheme: bearer, secret: orders-api}}]")
    )
    server.answer("/orders", Answer())
    args = {"method": "GET", "url": f"{server.base_url}/orders"}
    extras = {
        http.SETTINGS_KEY: HttpToolSettings(timeout_s=5),
        http.OUTBOUND_KEY: OutboundSettings(allow_private=True),
    }
    wrong = redeclared("orders-api", "llm", EVENTOS_SECRET_ORDERS_API="orders-token-123")
    result = await ToolRunner(pool, wrong, extras).run(call(name, args))
    assert result.outcome == names.TOOL_FAILED
    assert (
        "secret 'orders-api' is declared for 'llm', not 'http:127.0.0.1'"
        in json.loads(result.content)["error"]
    )
    assert server.requests("/orders") == []  # nothing sent, the secret least of all
    right = await ToolRunner(pool, RIGHT, extras).run(call(name, args))
    assert right.outcome == names.TOOL_OK
    (seen,) = server.requests("/orders")
    assert seen.headers["Authorization"] == "Bearer orders-token-123"


@pytest.fixture
def endpoint() -> Iterator[PollEndpoint]:
    server = PollEndpoint().start()
    yield server
    server.stop()


async def test_a_poll_sends_a_credential_only_for_its_host_purpose(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint
) -> None:
    req = await poll_employee(pool, endpoint, ", auth: {scheme: bearer, secret: feed-token}")
    wrong = redeclared("feed-token", "http:127.0.0.1", EVENTOS_SECRET_FEED_TOKEN="feed-token-value")
    async with http_client(OutboundSettings(allow_private=True)) as client:
        verdict = await Poller(pool, client, wrong).cycle(req)
        assert verdict.error is not None
        assert "declared for 'http:127.0.0.1', not 'poll:127.0.0.1'" in verdict.error
        assert endpoint.requests == []
        await Poller(pool, client, RIGHT).cycle(req)
    assert endpoint.requests[-1].headers["Authorization"] == "Bearer feed-token-value"


async def test_a_model_credential_is_sent_only_as_an_llm_secret() -> None:
    endpoints = LlmEndpoints((Endpoint("gw", "http://127.0.0.1:9/v1", ("*",)),))
    model = ModelRef("openai", "gpt-4.1-mini", "stripe-whsec", "http://127.0.0.1:9/v1")
    async with httpx.AsyncClient() as client:
        with pytest.raises(ApplicationError) as refused:
            provider_for(model, endpoints, SecretStore(env=SECRETS), client)
        assert refused.value.non_retryable
        assert "declared for 'webhook', not 'llm'" in str(refused.value)
        right = redeclared("stripe-whsec", "llm")
        assert provider_for(model, endpoints, right, client).key == "whsec_test_stripe"  # type: ignore[attr-defined]


async def test_a_driver_token_authenticates_only_as_a_driver_secret(
    pool: AsyncConnectionPool[Conn],
) -> None:
    await apply_and_start(pool, COURIER)
    wrong = DriverTable(pool, redeclared("courier-driver", "webhook"))
    assert await wrong.authenticate(COURIER_DRIVER_TOKEN.encode()) is None
    right = DriverTable(pool, SecretStore(env=SECRETS))
    assert await right.authenticate(COURIER_DRIVER_TOKEN.encode()) == Driver("drv-2")


async def test_a_channel_account_is_read_only_with_a_channel_secret(
    pool: AsyncConnectionPool[Conn],
) -> None:
    fake = FakeTelegram()
    await fake.start()
    token, name = fake.add_bot(), f"c{uuid.uuid4().hex[:8]}"
    source = f"telegram:tg-{name}"
    secret = {f"EVENTOS_SECRET_TG_{name.upper()}": token}
    await apply_and_start(pool, telegram_spec(name))
    fake.customer_message(token, 7101, "hello")

    async def account() -> dict[str, Any] | None:
        rows = await query(pool, f"SELECT * FROM channel_accounts WHERE id = '{source}'")
        return rows[0] if rows and rows[0]["error"] else None

    async def inbox() -> list[dict[str, Any]] | None:
        return await query(pool, f"SELECT * FROM bus_ingress WHERE source_key = '{source}'") or None

    try:
        async with httpx.AsyncClient() as client:
            reader = TelegramReader(TelegramApi(client, fake.base_url), 1)
            readers = {"telegram": reader}
            wrong = ChannelReaders(
                pool,
                redeclared(f"tg-{name}", "llm", **secret),
                channel_settings(fake),
                readers,
                owner="wrong",
            )
            task = asyncio.create_task(wrong.run())
            try:
                down = await wait_for(account, timeout=30, what="the account down")
            finally:
                await cancel_and_wait([task], 30)
            assert f"secret 'tg-{name}' is declared for 'llm', not 'channel'" in down["error"]
            assert (
                await query(pool, f"SELECT * FROM bus_ingress WHERE source_key = '{source}'") == []
            )
            right = ChannelReaders(
                pool,
                SecretStore(env={**SECRETS, **secret}),
                channel_settings(fake, lease_ttl_s=1),
                readers,
                owner="right",
            )
            task = asyncio.create_task(right.run())
            try:
                await wait_for(inbox, timeout=60, what="the customer's message read")
            finally:
                await cancel_and_wait([task], 30)
    finally:
        await fake.stop()


@pytest.fixture
async def ingress(db_settings: DatabaseSettings, tmp_path: Path) -> AsyncIterator[Service]:
    """Ingress after the operator declared stripe-whsec for `llm` (github-hook stays a webhook's)."""
    from eventos_ingress.app import build

    cfg = ingress_config(db_settings, tmp_path, secrets=redeclared("stripe-whsec", "llm"))
    service = await build(cfg)
    task = await run_service(service)
    yield service
    service.stop()
    await asyncio.wait_for(task, 15)


async def test_a_webhook_verifies_only_with_a_webhook_secret(
    started: str, ingress_url: str, pool: AsyncConnectionPool[Conn]
) -> None:
    body = json.dumps({"id": f"evt_{uuid.uuid4().hex}", "type": "invoice.paid"}).encode()
    async with httpx.AsyncClient(base_url=ingress_url, timeout=10) as client:
        refused = await client.post("/hooks/stripe", content=body, headers=signing.stripe(body))
        assert refused.status_code == 503, refused.text
        other = json.dumps({"id": uuid.uuid4().hex}).encode()
        right = await client.post(
            "/hooks/github", content=other, headers=signing.github(other, uuid.uuid4().hex)
        )
        assert right.status_code == 200, right.text
    assert await query(pool, "SELECT * FROM bus_ingress WHERE source_key = 'webhook:stripe'") == []
