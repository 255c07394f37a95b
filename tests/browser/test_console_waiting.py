"""The console's "Why waiting" tells an approval gate as `waiting` does (issue 26 point 3), in a
real browser on the real stack: a customer's reply held for approval (`approvals.sends`), and
the customer's next message waiting behind it names that approval, the rule that asked for it
and its expiry."""

from __future__ import annotations

from typing import Any

import pytest
from browser_stack import Tabs, browser, expect, tabs  # noqa: F401
from channel_stack import Stack
from conftest import ADMIN_TOKEN, E2E_TIMEOUT_S
from test_console import base, stack, waiting_rows  # noqa: F401 (`stack` is a fixture)

from eventos.testing import wait_for

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]


async def test_a_message_behind_a_held_reply_shows_its_approval(stack: Stack, tabs: Tabs) -> None:  # noqa: F811
    s = stack
    s.fake.customer_message(s.token, 5151, "the first question")

    async def pending() -> dict[str, Any] | None:
        r = await s.api.get("/v1/approvals", params={"state": "pending"})
        rows = r.json()["approvals"]
        return rows[0] if rows else None

    ap = await wait_for(pending, timeout=60, interval=0.2, what="the reply held for approval")
    s.fake.customer_message(s.token, 5151, "and a second one")

    async def behind() -> dict[str, Any] | None:
        rows = await waiting_rows(s)
        return rows[0] if rows and rows[0]["gate"]["code"] == "approval" else None

    row = await wait_for(behind, timeout=60, interval=0.2, what="the next message behind it")
    gate = row["gate"]
    assert gate["approval"] == ap["id"] and "spec.approvals.sends (telegram)" in gate["text"]
    tab = await tabs.open(base(s))
    await tab.sign_in(ADMIN_TOKEN)
    await tab.open("employee", s.name)
    waits = tab.page.get_by_role("table", name="Inputs not yet consumed, and the gate holding each")
    await expect(waits.get_by_role("row").nth(1)).to_contain_text("approval")
    await expect(waits).to_contain_text(gate["text"])
    assert "conversation's hands" not in await waits.inner_text()
    assert "second one" not in await waits.inner_text()  # an input in words, never its text
    tab.check_clean(ADMIN_TOKEN, "second one")
