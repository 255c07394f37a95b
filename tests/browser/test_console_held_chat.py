"""The chat page agrees with `waiting` and `chat --wait` on a held reply (issue 26 point 3): a
user whose reply a content rule of the owner holds sees its message "held for review" as the
notice arrives, and again after a reload (the history's `reply_status`), never "answered" and
never the draft."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from browser_stack import PHONE, Tabs, browser, expect, tabs  # noqa: F401
from channel_stack import Stack, egress_running, telegram_stack
from conftest import E2E_TIMEOUT_S
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.db import Conn
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.keys import OutboxKeys
from eventos.settings import DatabaseSettings, TemporalSettings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

# Owner chat besides the Telegram account; the owner's rule holds any chat reply about refunds.
SPEC_EXTRA = """    - {kind: chat}
  content_rules:
    - {id: no-refunds, kind: keyword, words: [refund], applies_to: [chat]}
"""


@pytest.fixture
async def stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, spec_extra=SPEC_EXTRA) as s:  # fmt: skip
        yield s


async def test_a_users_held_reply_reads_held_for_review_live_and_after_a_reload(
    stack: Stack, tabs: Tabs
) -> None:
    s = stack
    r = await s.api.post("/v1/users", json={"name": "carol"})
    assert r.status_code == 201, r.text
    carol = str(r.json()["token"])
    base = str(s.api.base_url).rstrip("/")
    async with egress_running(s):
        tab = await tabs.open(base, viewport=PHONE)
        await tab.sign_in(carol)
        page = tab.page
        await tab.open("chat", s.name)
        await expect(page.get_by_text("live", exact=True)).to_be_visible()
        await page.get_by_label("Message").fill("can I get a refund")
        await page.get_by_role("button", name="Send").click()
        # The reply ("you said: can I get a refund") is held: the chat says so as it happens.
        state = page.locator("li.msg.mine .msg-state")
        await expect(state).to_have_text(names.HELD_FOR_REVIEW)
        await expect(page.locator("li.msg.notice")).to_have_text(names.HELD_FOR_REVIEW)
        await tab.shot("chat-held-phone")
        # A reload reads the history: the same word, from the message's reply_status.
        await page.reload()
        await expect(page.locator("li.msg.mine .msg-state")).to_have_text(names.HELD_FOR_REVIEW)
        assert await page.locator("li.msg.theirs").count() == 0  # never the draft
        assert "you said" not in await page.content()
    tab.check_clean(carol, "refund")
