"""A turn in the console, in a real browser on the real stack (issue 26 point 4): its steps with
durations, attempts, model, tokens and cost; the admin's opt-in transcript view (and what the
console says while it is off); attention items, dead letters and approvals linking to their
employee and turn, a held approval naming its rule."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from browser_stack import PHONE, Tabs, browser, expect, tabs  # noqa: F401
from channel_stack import Stack, egress_running, telegram_stack
from conftest import ADMIN_TOKEN, E2E_TIMEOUT_S
from playwright.async_api import Page
from psycopg_pool import AsyncConnectionPool

from eventos.console.settings import ConsoleSettings
from eventos.db import Conn
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.keys import OutboxKeys
from eventos.settings import DatabaseSettings, TemporalSettings
from eventos.testing import wait_for

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

# Owner chat besides the Telegram account, and every Telegram reply held for approval.
SPEC_EXTRA = "    - {kind: chat}\n  approvals: {sends: [telegram], expire_after_h: 48}\n"


async def _stack(
    transcripts: bool, pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings,
    tmp_path: Path, temporal_settings: TemporalSettings, outbox_keys: OutboxKeys,
    llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, spec_extra=SPEC_EXTRA,
                              console=ConsoleSettings(transcripts=transcripts)) as s:  # fmt: skip
        yield s


@pytest.fixture
async def stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    """The stack with transcript views on (EVENTOS_CONSOLE_TRANSCRIPTS=1)."""
    async for s in _stack(True, pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                          llm_endpoints):  # fmt: skip
        yield s


@pytest.fixture
async def stack_off(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    """The stack as every instance starts: transcript views off."""
    async for s in _stack(False, pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                          llm_endpoints):  # fmt: skip
        yield s


def base(s: Stack) -> str:
    return str(s.api.base_url).rstrip("/")


async def chat_answered(s: Stack, text: str) -> None:
    doc = {"client_message_id": uuid.uuid4().hex, "text": text}
    sent = await s.api.post(f"/v1/employees/{s.name}/chat", json=doc)
    assert sent.status_code == 202, sent.text
    message = sent.json()["message_id"]

    async def answered() -> bool:
        r = await s.api.get(f"/v1/employees/{s.name}/chat/{message}")
        return r.json()["reply"] is not None

    async with egress_running(s):
        await wait_for(answered, timeout=60, interval=0.2, what="the reply")


async def open_first_turn(page: Page, name: str) -> None:
    """From the employee's page, through the newest turn's link, to the turn's page."""
    turn = page.locator("details.turn").first
    await turn.locator("summary").click()
    await turn.get_by_role("link", name=re.compile(r"^Open turn \d+$")).click()
    await expect(
        page.get_by_role("heading", name=re.compile(rf"^Turn \d+ of {name}$"))
    ).to_be_visible()


async def test_a_turn_shows_its_steps_and_the_admin_reads_its_transcript(
    stack: Stack, tabs: Tabs
) -> None:
    s = stack
    await chat_answered(s, "fail: 500 1\nwhat is on my list today")  # one failed attempt first
    tab = await tabs.open(base(s))
    await tab.sign_in(ADMIN_TOKEN)
    await tab.open("employee", s.name)
    page = tab.page
    await open_first_turn(page, s.name)
    steps = page.get_by_role("table", name="Each model and tool call, in order")
    row = steps.get_by_role("row").nth(1)
    await expect(row).to_contain_text("local/scripted")
    await expect(row.locator("td[data-label=Attempts]")).to_have_text("2")
    await expect(row.locator("td[data-label=Took]")).to_have_text(
        re.compile(r"^\d+(\.\d+)? (s|min)$")
    )
    await expect(row.locator("td[data-label=Cost]")).to_contain_text("$")
    await expect(page.locator("dl.facts")).to_contain_text("done")
    await tab.shot("turn")
    assert "what is on my list" not in await page.content()  # nothing shown before asked

    await page.get_by_role("button", name="Show transcript").click()
    said = page.get_by_role("list", name="What the model was asked and answered")
    await expect(said.get_by_role("listitem").first).to_contain_text("what is on my list today")
    await expect(said.get_by_role("listitem").last).to_contain_text("you said:")
    await tab.shot("transcript")
    r = await s.api.get(f"/v1/employees/{s.name}/timeline", params={"kind": "transcript"})
    (entry,) = r.json()["timeline"]
    assert entry["summary"].endswith("viewed by owner")
    # The view is on the employee's timeline, and its entry leads back to the turn.
    await tab.open("employee", s.name)
    await page.get_by_role(
        "link", name=re.compile(r"^transcript of turn \d+ viewed by owner$")
    ).click()
    await expect(
        page.get_by_role("heading", name=re.compile(rf"^Turn \d+ of {s.name}$"))
    ).to_be_visible()
    # On a phone the steps stack as cards and nothing scrolls sideways.
    phone = await tabs.open(base(s), viewport=PHONE)
    await phone.sign_in(ADMIN_TOKEN)
    await phone.open("turn", s.name, entry["ref"])
    await expect(phone.page.locator("td[data-label=Attempts]")).to_have_text("2")
    wide = await phone.page.evaluate("() => document.documentElement.scrollWidth > innerWidth")
    assert not wide
    await phone.shot("turn-phone")
    tab.check_clean(ADMIN_TOKEN, "list today")
    phone.check_clean(ADMIN_TOKEN)


async def test_with_transcripts_off_the_console_says_how_to_turn_them_on(
    stack_off: Stack, tabs: Tabs
) -> None:
    s = stack_off
    await chat_answered(s, "keep this to yourself")
    tab = await tabs.open(base(s))
    await tab.sign_in(ADMIN_TOKEN)
    await tab.open("employee", s.name)
    page = tab.page
    await open_first_turn(page, s.name)
    await page.get_by_role("button", name="Show transcript").click()
    notice = page.locator("p.notice")
    await expect(notice).to_contain_text("Transcripts are off")
    await expect(notice).to_contain_text("EVENTOS_CONSOLE_TRANSCRIPTS=1")
    assert "keep this to yourself" not in await page.content()
    r = await s.api.get(f"/v1/employees/{s.name}/timeline", params={"kind": "transcript"})
    assert r.json()["timeline"] == []
    tab.check_clean(ADMIN_TOKEN, "yourself")


async def test_an_approval_and_an_attention_item_link_to_their_turn_and_employee(
    stack: Stack, tabs: Tabs
) -> None:
    s = stack
    s.fake.cut_next(s.token, 1, applied=True)  # Telegram sent it; its answer never arrived
    async with egress_running(s):
        s.fake.customer_message(s.token, 7171, "hold and link me")

        async def pending() -> dict[str, Any] | None:
            r = await s.api.get("/v1/approvals", params={"state": "pending"})
            rows = r.json()["approvals"]
            return rows[0] if rows else None

        approval = await wait_for(pending, timeout=60, interval=0.2, what="the held reply")
        assert approval["rule"] == "approvals.sends: telegram" and approval["turn_id"]
        tab = await tabs.open(base(s))
        await tab.sign_in(ADMIN_TOKEN)
        page = tab.page
        await tab.open("approvals")
        card = page.get_by_role("article", name=f"Approval {approval['id']}")
        await expect(card).to_contain_text("Held by the rule approvals.sends: telegram")
        await expect(card.get_by_role("link", name=s.name)).to_be_visible()
        await tab.shot("approval-rule")
        await card.get_by_role("link", name=re.compile(r"^turn \d+$")).click()
        await expect(
            page.get_by_role("heading", name=re.compile(rf"^Turn \d+ of {s.name}$"))
        ).to_be_visible()
        await expect(page.get_by_text(approval["turn_id"])).to_be_visible()

        await s.api.post(f"/v1/approvals/{approval['id']}:approve")
        await s.one_outbox("unknown")
        await tab.open("attention")
        item = page.get_by_role("article").filter(has_text="send_unknown")
        await expect(item.get_by_role("link", name=re.compile(r"^turn \d+$"))).to_be_visible()
        await tab.shot("attention-links")
        await item.get_by_role("link", name=s.name).click()
        await expect(page.get_by_role("heading", name=s.name, exact=True)).to_be_visible()
    tab.check_clean(ADMIN_TOKEN, "link me")


async def test_a_dead_letter_links_to_the_turn_that_failed_and_its_cause(
    stack: Stack, tabs: Tabs
) -> None:
    s = stack
    doc = {"client_message_id": uuid.uuid4().hex, "text": "refuse me\nfail: 400"}
    assert (await s.api.post(f"/v1/employees/{s.name}/chat", json=doc)).status_code == 202

    async def letter() -> dict[str, Any] | None:
        r = await s.api.get("/v1/dead-letters", params={"employee": s.name})
        rows = r.json()["dead_letters"]
        return rows[0] if rows else None

    async with egress_running(s):
        dead = await wait_for(letter, timeout=120, interval=0.2, what="the dead letter")
    tab = await tabs.open(base(s))
    await tab.sign_in(ADMIN_TOKEN)
    page = tab.page
    await tab.open("dead-letters")
    row = page.get_by_role("row").filter(has_text=dead["id"])
    await expect(row.get_by_role("link", name=s.name)).to_be_visible()
    await row.get_by_role("link", name=re.compile(r"^turn \d+$")).click()
    await expect(page.get_by_role("heading", name="Why it failed")).to_be_visible()
    turn = (await s.api.get(f"/v1/employees/{s.name}/turns/{dead['turn_id']}")).json()
    await expect(page.locator("p.error")).to_have_text(turn["error"])
    await expect(page.locator("dl.facts")).to_contain_text("failed")
    await tab.shot("turn-failed")
    tab.check_clean(ADMIN_TOKEN, "refuse")
