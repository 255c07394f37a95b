"""The console an operator expects (issue 26 point 4), in a real browser on the real stack: every
page reads again on its own when the operator event stream tells of a change, the navigation
counts what waits, an unknown employee is one not-found state, every time is said one way (as
`eventosctl` says it), and the timeline stays compact on a phone."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from zoneinfo import ZoneInfo

import pytest
from browser_stack import PHONE, Tabs, browser, expect, tabs  # noqa: F401
from channel_stack import Stack, egress_running, now
from conftest import ADMIN_TOKEN, E2E_TIMEOUT_S
from playwright.async_api import Response
from test_cli_times import AGO_CASES, EXACT_CASES, NOW
from test_console import _pending_approval, base, chat_api, lifecycle, new_user, stack  # noqa: F401

from eventos.cli import main, times
from eventos.testing import wait_for

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

ZONE = "Asia/Kolkata"  # +05:30: an offset no test machine is in by chance


async def test_every_page_updates_live_and_the_nav_counts_follow(stack: Stack, tabs: Tabs) -> None:
    s = stack
    tab = await tabs.open(base(s))
    await tab.sign_in(ADMIN_TOKEN)
    page = tab.page
    await page.evaluate("() => { window.neverReloaded = true }")
    nav = page.get_by_role("navigation", name="Pages")
    await expect(page.get_by_text("updates live")).to_be_visible()
    await expect(nav.locator(".count")).to_have_count(0)  # nothing waits yet

    s.fake.cut_next(s.token, 1, applied=True)  # Telegram sends it; its answer never arrives
    async with egress_running(s):
        # Approvals: a reply held for approval shows up, and the navigation counts it.
        await tab.open("approvals")
        await expect(page.get_by_text("Nothing here.")).to_be_visible()
        s.fake.customer_message(s.token, 7171, "live please")
        card = page.get_by_role("article").filter(has_text="live please")
        await expect(card).to_be_visible()
        await expect(nav.get_by_role("link", name="Approvals: 1 pending")).to_be_visible()

        # Outbox: approved from elsewhere, its send's fate becomes unknown, here and counted.
        approval = await wait_for(_pending_approval(s), timeout=60, interval=0.2,
                                  what="the reply held for approval")  # fmt: skip
        await tab.open("outbox")
        (held,) = await s.outbox()
        row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=str(held["id"]),
                                                                  exact=True))  # fmt: skip
        await expect(row).to_contain_text("held")
        assert (await s.api.post(f"/v1/approvals/{approval}:approve")).status_code == 202
        await expect(row.get_by_role("button", name=f"Retry send {held['id']}")).to_be_visible()
        await expect(nav.get_by_role("link", name="Outbox: 1 unknown")).to_be_visible()
        await expect(nav.get_by_role("link", name="Attention: 1 open")).to_be_visible()
        await expect(nav.get_by_role("link", name="Approvals", exact=True)).to_be_visible()

        # Attention: the item shows, and goes when it is resolved from elsewhere.
        await tab.open("attention")
        item = page.get_by_role("article").filter(has_text="send_unknown")
        await expect(item).to_be_visible()
        (raised,) = await s.attention("send_unknown")
        r = await s.api.post(f"/v1/attention/{raised['id']}:resolve")
        assert r.status_code == 200, r.text
        await expect(item).to_have_count(0)
        await expect(nav.get_by_role("link", name="Attention", exact=True)).to_be_visible()
        r = await s.api.post(f"/v1/outbox/{held['id']}:retry")
        assert r.status_code == 202, r.text
        await expect(nav.get_by_role("link", name="Outbox", exact=True)).to_be_visible()

        # An employee's page: a turn that ran shows up, and its timeline grows.
        await tab.open("employee", s.name)
        turns = page.locator("details.turn")
        await expect(turns.first).to_be_visible()
        before = await turns.count()
        # A keyboard user's place is kept: the focused button has the focus after the redraw.
        conversations = page.get_by_role("table", name="Newest generation first")
        focused = await conversations.get_by_role("button").first.text_content()
        await conversations.get_by_role("button", name=focused, exact=True).focus()
        await chat_api(s, "one more turn")
        await expect(turns).to_have_count(before + 1)
        await expect(turns.first).to_contain_text("done")
        await expect(conversations.get_by_role("button", name=focused, exact=True)).to_be_focused()

    # Employees: stopped from elsewhere, the row says so.
    await tab.open("employees")
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=s.name))
    await expect(row).to_contain_text("running")
    await lifecycle(s, "stop")
    await expect(row).to_contain_text("paused")
    assert await page.evaluate("() => window.neverReloaded") is True  # all of it without a reload
    tab.check_clean(ADMIN_TOKEN, "live please")


async def test_an_unknown_employee_is_one_not_found_state(stack: Stack, tabs: Tabs) -> None:
    tab = await tabs.open(base(stack))
    page = tab.page
    refused: list[str] = []

    def answered(response: Response) -> None:
        if "/v1/employees/nobody" in response.url and response.status == 404:
            refused.append(response.url)

    page.on("response", answered)
    await tab.sign_in(ADMIN_TOKEN)
    await tab.open("employee", "nobody")
    main_part = page.locator("main")
    await expect(main_part.get_by_role("heading", name="Not found")).to_be_visible()
    # Every read of the page was refused (the employee, why waiting, conversations, turns,
    # timeline), and it says so once.
    await wait_for(now(lambda: len(refused) >= 5 or None), timeout=60, interval=0.1,
                   what="the page's five reads answered")  # fmt: skip
    await expect(main_part.get_by_role("heading")).to_have_count(1)
    await expect(main_part).to_contain_text("No employee is named “nobody”.")
    await expect(main_part.locator(".error")).to_have_count(0)
    await expect(page.get_by_role("status")).to_have_text("")
    await tab.shot("not-found")
    await main_part.get_by_role("link", name="Back to the employees").click()
    await expect(page.get_by_role("heading", name="Employees")).to_be_visible()
    # The same state for a page the console does not have, and a chat with nobody.
    for route in (("nonsense",), ("chat", "nobody")):
        await tab.open(*route)
        await expect(main_part.get_by_role("heading", name="Not found")).to_be_visible()
        await expect(main_part.locator(".error")).to_have_count(0)
    tab.check_clean(ADMIN_TOKEN)


@contextmanager
def local_zone(zone: str) -> Iterator[None]:
    """This process's local time zone (what `eventosctl` prints in) set to `zone`."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


async def test_the_console_and_the_cli_say_a_time_one_way(
    stack: Stack, tabs: Tabs, capsys: pytest.CaptureFixture[str]
) -> None:
    s = stack
    await new_user(s, "carol")
    tab = await tabs.open(base(s), timezone=ZONE)
    await tab.sign_in(ADMIN_TOKEN)
    page = tab.page
    # The console's own functions, on the cases the CLI's unit test holds.
    dom = next(u for u in tab.urls if u.endswith("/dom.js"))
    said = await page.evaluate(
        """async ([dom, now, agos, exacts]) => {
             const m = await import(dom);
             return [agos.map((iso) => m.ago(iso, Date.parse(now))), exacts.map(m.exact)];
           }""",
        [dom, NOW, [iso for iso, _ in AGO_CASES], [iso for iso, _, _ in EXACT_CASES]],
    )
    assert said[0] == [words for _, words in AGO_CASES]
    assert said[1] == [times.exact(iso, ZoneInfo(ZONE)) for iso, _, _ in EXACT_CASES]

    # A list on a page says how long ago, and when (with the offset) on hover; the CLI's list
    # says the same words, its wide form the same time.
    await tab.open("users")
    created = page.get_by_role("row").filter(has_text="carol").locator("time")
    await expect(created).to_have_text(re.compile(r"^(now|\d+[smhd] ago)$"))
    exact = await created.get_attribute("title")
    assert exact is not None and exact.endswith("+05:30"), exact
    url = base(s)
    with local_zone(ZONE):
        for form in ([], ["-o", "wide"]):
            argv = ["users", *form, "--url", url, "--token", ADMIN_TOKEN]
            assert await asyncio.to_thread(main, argv) == 0
            (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("carol")]
            if form:
                assert line.split()[-1] == exact, line
            else:
                assert re.search(r"(now|\d+[smhd] ago)$", line), line
    tab.check_clean(ADMIN_TOKEN)


async def test_the_timeline_is_compact_on_a_phone(stack: Stack, tabs: Tabs) -> None:
    s = stack
    async with egress_running(s):
        message = await chat_api(s, "fill my timeline")

        async def answered() -> bool:
            r = await s.api.get(f"/v1/employees/{s.name}/chat/{message}")
            return r.json()["reply"] is not None

        await wait_for(answered, timeout=60, interval=0.2, what="the reply")
    tab = await tabs.open(base(s), viewport=PHONE)
    await tab.sign_in(ADMIN_TOKEN)
    await tab.open("employee", s.name)
    page = tab.page
    timeline = page.locator("section").filter(has=page.get_by_role("heading", name="Timeline"))
    entries = timeline.locator("tbody tr")
    await expect(entries.nth(3)).to_be_visible()
    heights = await entries.evaluate_all(
        "rows => rows.map((r) => r.getBoundingClientRect().height)"
    )
    # Two lines an entry (a long summary may wrap to a third), never a card of five labels.
    assert max(heights) <= 100, heights
    assert await page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    await tab.shot("employee-timeline-phone")
    tab.check_clean(ADMIN_TOKEN, "fill my")
