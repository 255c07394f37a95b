"""The web console in a real browser on the real stack (issue 16 point 7): sign in with a token,
chat and see the reply arrive live, approve a held send, Retry an `unknown` send, resolve an
attention item with its action, replay a dead letter after its confirmation, read why an input
waits and an employee's conversations and turns, and one user's console never showing another's
chat."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from browser_stack import PHONE, Tabs, browser, expect, tabs  # noqa: F401
from channel_stack import Stack, egress_running, now, telegram_stack
from conftest import ADMIN_TOKEN, E2E_TIMEOUT_S
from psycopg_pool import AsyncConnectionPool
from test_router import query

from eventos.db import Conn
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.keys import OutboxKeys
from eventos.settings import DatabaseSettings, TemporalSettings
from eventos.testing import wait_for

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

# Owner chat besides the Telegram account, and every Telegram reply held for approval.
SPEC_EXTRA = "    - {kind: chat}\n  approvals: {sends: [telegram], expire_after_h: 48}\n"


@pytest.fixture
async def stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, spec_extra=SPEC_EXTRA) as s:  # fmt: skip
        yield s


def base(s: Stack) -> str:
    return str(s.api.base_url).rstrip("/")


async def new_user(s: Stack, name: str) -> str:
    r = await s.api.post("/v1/users", json={"name": name})
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


async def test_sign_in_then_chat_and_the_reply_arrives_live(stack: Stack, tabs: Tabs) -> None:
    s = stack
    tab = await tabs.open(base(s))
    await tab.page.goto(f"{base(s)}/console")  # the sign-in page, as a person first sees it
    await expect(tab.page.get_by_role("button", name="Sign in")).to_be_visible()
    await tab.shot("sign-in")
    await tab.sign_in(ADMIN_TOKEN)
    page = tab.page
    # The admin lands on the employees page: state, generation, budget, pending, attention.
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=s.name))
    await expect(row).to_contain_text("running")
    await tab.shot("employees")
    stored = await page.evaluate("() => sessionStorage.getItem('eventos.token')")
    assert stored == ADMIN_TOKEN  # kept in this tab's sessionStorage, nowhere else
    assert await page.evaluate("() => localStorage.length") == 0

    async with egress_running(s):
        await tab.open("chat", s.name)
        await expect(page.get_by_text("live", exact=True)).to_be_visible()
        # Markup in a message is shown as text, never run or rendered.
        await page.get_by_label("Message").fill("hello <b>from</b> <img src=x> the console")
        await page.get_by_role("button", name="Send").click()
        # No reload: the reply comes over the chat's event stream.
        reply = page.locator("li.msg.theirs").filter(has_text="you said: hello <b>from</b>")
        await expect(reply).to_be_visible()
        await expect(page.locator("li.msg.mine .msg-state")).to_have_text("answered")
        assert await page.locator("ol.chat b, ol.chat img").count() == 0
    await tab.shot("chat")
    tab.check_clean(ADMIN_TOKEN, "hello")


async def test_a_held_send_is_approved_with_its_draft_shown(stack: Stack, tabs: Tabs) -> None:
    s = stack
    async with egress_running(s):
        s.fake.customer_message(s.token, 4242, "please hold this reply")

        async def pending() -> bool:
            r = await s.api.get("/v1/approvals", params={"state": "pending"})
            return bool(r.json()["approvals"])

        await wait_for(pending, timeout=60, interval=0.2, what="the reply held for approval")
        tab = await tabs.open(base(s))
        await tab.sign_in(ADMIN_TOKEN)
        await tab.open("approvals")
        card = tab.page.get_by_role("article").filter(has_text="please hold this reply")
        await expect(card.locator("pre.draft")).to_contain_text("you said: please hold this reply")
        await tab.shot("approvals")
        assert s.fake.sent(s.token, 4242) == []  # nothing left before the decision
        await card.get_by_role("button", name="Approve").click()
        await expect(tab.page.get_by_role("status")).to_contain_text("approved")
        sent = await wait_for(now(lambda: s.fake.sent(s.token, 4242) or None), timeout=60,
                              what="the approved reply sent")  # fmt: skip
    assert len(sent) == 1 and "please hold this reply" in sent[0]["text"]
    tab.check_clean(ADMIN_TOKEN, "please")


async def test_an_unknown_send_is_sent_again_with_retry(stack: Stack, tabs: Tabs) -> None:
    s = stack
    s.fake.cut_next(s.token, 1, applied=True)  # Telegram sent it; its answer never arrived
    async with egress_running(s):
        s.fake.customer_message(s.token, 5151, "did it arrive")
        approval = await wait_for(_pending_approval(s), timeout=60, interval=0.2,
                                  what="the reply held for approval")  # fmt: skip
        await s.api.post(f"/v1/approvals/{approval}:approve")
        row = await s.one_outbox("unknown")
        tab = await tabs.open(base(s))
        await tab.sign_in(ADMIN_TOKEN)
        await tab.open("outbox")
        await tab.page.get_by_label("Status").select_option("unknown")
        retry = tab.page.get_by_role("button", name=f"Retry send {row['id']}")
        await tab.shot("outbox")
        await retry.click()
        await expect(tab.page.get_by_role("status")).to_contain_text("queued once more")
        await s.one_outbox("sent")
    assert len(s.fake.sent(s.token, 5151)) == 2  # the owner chose to send it again
    tab.check_clean(ADMIN_TOKEN)


def _pending_approval(s: Stack) -> Callable[[], Awaitable[str | None]]:
    async def found() -> str | None:
        r = await s.api.get("/v1/approvals", params={"state": "pending"})
        rows = r.json()["approvals"]
        return str(rows[0]["id"]) if rows else None

    return found


async def test_an_employee_shows_its_conversations_and_turns_with_cost(
    stack: Stack, tabs: Tabs
) -> None:
    s = stack
    async with egress_running(s):
        sent = await s.api.post(f"/v1/employees/{s.name}/chat",
                                json={"client_message_id": "m1", "text": "count my cost"})  # fmt: skip
        assert sent.status_code == 202, sent.text
        message = sent.json()["message_id"]

        async def answered() -> bool:
            r = await s.api.get(f"/v1/employees/{s.name}/chat/{message}")
            return r.json()["reply"] is not None

        await wait_for(answered, timeout=60, interval=0.2, what="the reply")
    tab = await tabs.open(base(s))
    await tab.sign_in(ADMIN_TOKEN)
    await tab.open("employee", s.name)
    page = tab.page
    await expect(page.get_by_role("heading", name="Conversations")).to_be_visible()
    await expect(page.get_by_role("button", name="front/main")).to_be_visible()
    turn = page.locator("details.turn").first
    await expect(turn).to_contain_text("done")
    await expect(turn).to_contain_text("$")
    await turn.locator("summary").click()
    await expect(turn.locator("ol.steps li").first).to_contain_text("model local/scripted")
    await tab.shot("employee")
    tab.check_clean(ADMIN_TOKEN)


async def test_a_user_sees_only_their_own_chat(stack: Stack, tabs: Tabs) -> None:
    s = stack
    admin = await tabs.open(base(s))
    await admin.sign_in(ADMIN_TOKEN)
    await admin.open("users")
    await admin.page.get_by_label("New user").fill("alice")
    await admin.page.get_by_role("button", name="Add").click()
    shown = admin.page.get_by_label("Token of alice")
    await expect(shown).to_have_value(re.compile(r"^eos_u_"))
    alice = await shown.input_value()  # shown this once
    await expect(admin.page.get_by_role("cell", name="alice", exact=True)).to_be_visible()
    await admin.shot("users")
    bob = await new_user(s, "bob")
    async with egress_running(s):
        tab_a = await tabs.open(base(s))
        await tab_a.sign_in(alice)
        await tab_a.open("chat", s.name)
        await tab_a.page.get_by_label("Message").fill("alice's secret plan")
        await tab_a.page.get_by_role("button", name="Send").click()
        mine = tab_a.page.locator("li.msg.theirs").filter(has_text="alice's secret plan")
        await expect(mine).to_be_visible()

        tab_b = await tabs.open(base(s), viewport=PHONE)
        await tab_b.sign_in(bob)
        page = tab_b.page
        # A user's console offers what a user token may do, and nothing else.
        nav = page.get_by_role("navigation", name="Pages")
        await expect(nav.get_by_role("link")).to_have_text(["Chat", "Approvals", "Attention"])
        await tab_b.open("chat", s.name)
        await expect(page.get_by_text("live", exact=True)).to_be_visible()
        # By keyboard alone: the message field, then Ctrl+Enter sends.
        await page.get_by_label("Message").focus()
        await page.keyboard.type("bob says hi")
        await page.keyboard.press("Control+Enter")
        await expect(page.locator("li.msg.theirs").filter(has_text="bob says hi")).to_be_visible()
        await tab_b.shot("chat-user-phone")
        assert "secret plan" not in await page.content()
        # A page the token may not open is not shown, and its API call is refused anyway.
        await tab_b.open("employees")
        await expect(page.get_by_role("status")).to_contain_text("not open to this token")
        refused = await page.evaluate(
            """async () => (await fetch('/v1/employee-summaries', {headers: {Authorization:
               'Bearer ' + sessionStorage.getItem('eventos.token')}})).status"""
        )
        assert refused == 403
        # Alice, reloading, still has her own conversation, and never bob's.
        await tab_a.page.reload()
        await expect(tab_a.page.locator("li.msg.mine")).to_have_count(1)
        assert "bob says hi" not in await tab_a.page.content()
    admin.check_clean(ADMIN_TOKEN, alice)
    tab_a.check_clean(alice, "secret")
    tab_b.check_clean(bob, "bob says")


async def test_every_console_answer_carries_its_security_headers(stack: Stack, tabs: Tabs) -> None:
    tab = await tabs.open(base(stack))
    answer = await tab.page.goto(f"{base(stack)}/console")
    assert answer is not None
    headers = answer.headers
    assert headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    await tab.sign_in(ADMIN_TOKEN)
    scripts = [u for u in tab.urls if re.search(r"/console/assets/[0-9a-f]{16}/.*\.js$", u)]
    assert scripts, tab.urls  # versioned asset names
    tab.check_clean(ADMIN_TOKEN)


async def lifecycle(s: Stack, action: str) -> None:
    """Stop, reset or start the stack's employee and wait until its intent is applied."""
    r = await s.api.post(f"/v1/employees/{s.name}:{action}", json={})
    assert r.status_code == 202, r.text
    intent = r.json()["intent"]["id"]

    async def applied() -> bool:
        return bool((await s.api.get(f"/v1/intents/{intent}")).json()["state"] == "applied")

    await wait_for(applied, timeout=60, interval=0.2, what=f"{action} applied")


async def chat_api(s: Stack, text: str) -> int:
    doc = {"client_message_id": uuid.uuid4().hex, "text": text}
    r = await s.api.post(f"/v1/employees/{s.name}/chat", json=doc)
    assert r.status_code == 202, r.text
    return int(r.json()["message_id"])


async def waiting_rows(s: Stack) -> list[dict[str, Any]]:
    r = await s.api.get(f"/v1/employees/{s.name}/waiting")
    assert r.status_code == 200, r.text
    return list(r.json()["waiting"])


async def test_why_an_input_waits_is_read_on_its_employee_page(stack: Stack, tabs: Tabs) -> None:
    s = stack
    await lifecycle(s, "stop")
    await chat_api(s, "hold me, please")

    async def gated() -> list[dict[str, Any]] | None:
        rows = await waiting_rows(s)
        return rows if rows and rows[0]["gate"]["code"] == "paused" else None

    (row,) = await wait_for(gated, timeout=60, interval=0.2, what="the input held by the pause")
    tab = await tabs.open(base(s))
    await tab.sign_in(ADMIN_TOKEN)
    await tab.open("employee", s.name)
    waits = tab.page.get_by_role("table", name="Inputs not yet consumed, and the gate holding each")
    await expect(waits.get_by_role("row").nth(1)).to_contain_text("paused")
    await expect(waits).to_contain_text(row["gate"]["text"])
    assert "hold me" not in await waits.inner_text()  # an input in words, never its text
    await tab.shot("employee-waiting")
    tab.check_clean(ADMIN_TOKEN, "hold me")


async def test_a_dead_letter_is_replayed_after_its_confirmation(stack: Stack, tabs: Tabs) -> None:
    s = stack
    await lifecycle(s, "stop")
    message = await chat_api(s, "are you still there")
    routed = (
        "SELECT 1 FROM bus_deliveries d JOIN bus_streams s USING (stream_key) WHERE s.employee = %s"
    )
    await wait_for(lambda: query(s.pool, routed, s.name), timeout=60, interval=0.2,
                   what="the message routed to the paused stream")  # fmt: skip
    await lifecycle(s, "reset")  # the paused stream's input dies with its generation
    await lifecycle(s, "start")
    async with egress_running(s):
        tab = await tabs.open(base(s))
        await tab.sign_in(ADMIN_TOKEN)
        await tab.open("dead-letters")
        page = tab.page
        row = page.get_by_role("row").filter(has_text="reset")
        await expect(row).to_have_count(1)
        await row.get_by_role("button", name=re.compile(r"^Replay dead letter")).click()
        confirm = page.get_by_role("region", name="Replay")
        await expect(confirm).to_contain_text("1 dead letter would be routed once more")
        await tab.shot("dead-letters")
        assert (await s.api.get(f"/v1/employees/{s.name}/chat/{message}")).json()["reply"] is None
        await confirm.get_by_role("button", name="Replay 1").click()
        await expect(page.get_by_role("status")).to_contain_text("Replayed 1.")

        async def answered() -> str | None:
            r = await s.api.get(f"/v1/employees/{s.name}/chat/{message}")
            return r.json()["reply"]  # type: ignore[no-any-return]

        reply = await wait_for(answered, timeout=60, interval=0.2, what="the replayed reply")
        await expect(row).to_contain_text("as ")  # the letter now says what replayed it
    assert "are you still there" in reply
    tab.check_clean(ADMIN_TOKEN, "still")


async def test_an_attention_item_is_resolved_by_its_action(stack: Stack, tabs: Tabs) -> None:
    s = stack
    s.fake.cut_next(s.token, 1, applied=True)  # Telegram sent it; its answer never arrived
    async with egress_running(s):
        s.fake.customer_message(s.token, 6161, "answer me once")
        approval = await wait_for(_pending_approval(s), timeout=60, interval=0.2,
                                  what="the reply held for approval")  # fmt: skip
        await s.api.post(f"/v1/approvals/{approval}:approve")
        await s.one_outbox("unknown")
        tab = await tabs.open(base(s))
        await tab.sign_in(ADMIN_TOKEN)
        await tab.open("attention")
        card = tab.page.get_by_role("article").filter(has_text="send_unknown")
        await expect(card).to_contain_text("open")
        await tab.shot("attention")
        await card.get_by_role("button", name=re.compile(r"^Retry")).click()
        await expect(tab.page.get_by_role("status")).to_contain_text("Retry done")
        await s.one_outbox("sent")
        await expect(card).to_have_count(0)  # resolved: no longer listed as open
    assert len(s.fake.sent(s.token, 6161)) == 2  # the owner chose to send it again
    tab.check_clean(ADMIN_TOKEN)
