"""Secrets never reach a log (issue 25 point 3): a Telegram poll and send and a Discord
interaction answered on the real stack, with the services' logging at DEBUG captured as a
service configures it; neither the bot token nor the interaction token is in what it wrote."""

from __future__ import annotations

import io
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from channel_stack import Stack, egress_running, now, telegram_stack
from fake_discord import TOKEN as DISCORD_BOT_TOKEN
from psycopg_pool import AsyncConnectionPool
from test_channel_discord import egress_running as discord_egress
from test_channel_discord import stack as discord  # noqa: F401 (a fixture)

from eventos.db import Conn
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.keys import OutboxKeys
from eventos.settings import DatabaseSettings, TemporalSettings
from eventos.telemetry.logs import configure_logging
from eventos.telemetry.redact import CLIENT_LOGGERS
from eventos.telemetry.settings import LogSettings
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal


@pytest.fixture
def service_logs() -> Iterator[io.StringIO]:
    """Logging as a service sets it up (eventos.telemetry), at DEBUG, into a buffer; the test
    process's own logging comes back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    clients = {name: logging.getLogger(name).level for name in CLIENT_LOGGERS}
    out = io.StringIO()
    configure_logging(LogSettings("text", "DEBUG"), stream=out)
    try:
        yield out
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for name, was in clients.items():
            logging.getLogger(name).setLevel(was)


@pytest.fixture
async def telegram(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
    service_logs: io.StringIO,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints) as s:  # fmt: skip
        yield s


async def test_a_telegram_poll_and_send_write_no_bot_token(
    telegram: Stack, service_logs: io.StringIO
) -> None:
    s = telegram
    async with egress_running(s):
        s.fake.customer_message(s.token, 737373, "a secret-free hello")
        await wait_for(now(lambda: s.fake.sent(s.token, 737373) or None), timeout=60,
                       interval=0.1, what="the reply sent")  # fmt: skip
        await s.one_outbox("sent")
    logging.getLogger("eventos.test").debug("bot %s polled", s.token)  # a careless line, too
    written = service_logs.getvalue()
    assert "polled" in written  # the capture is the services' own handler
    secret = s.token.split(":", 1)[1]
    assert s.token not in written and secret not in written


async def test_a_discord_interaction_answer_writes_no_token(
    discord: Any,  # noqa: F811 (the fixture)
    service_logs: io.StringIO,
) -> None:
    s = discord
    async with discord_egress(s):
        reply = await s.fake.interact(s.url, options={"question": "hello there"})
        assert reply.status == 200

        def answered() -> list[dict[str, Any]] | None:
            return [m for m in s.bot_messages() if m["content"]] or None

        await wait_for(now(answered), timeout=60, interval=0.1, what="the deferred answer")
        await s.one_outbox("sent")
    token = reply.interaction.token
    logging.getLogger("eventos.test").debug("answered %s", reply.interaction.id)
    written = service_logs.getvalue()
    assert "answered" in written
    assert token not in written and DISCORD_BOT_TOKEN not in written
