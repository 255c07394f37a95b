"""What the console's browser tests share: Playwright drives a headless Chromium against the real stack
(ingress with the console, workers on the dev server, egress, PostgreSQL, a Telegram fake).

The browser is found through one setting, EVENTOS_TEST_BROWSER (a Chromium executable); unset,
Debian's /usr/bin/chromium where it is installed (`make test` installs it as root), else the
Chromium that `playwright install chromium` downloaded. Every page the tests visit is saved as a
screenshot under test-output/console/ (git-ignored), on a desktop and on a phone (`NAME-phone`);
docs/console/ holds copies for the docs.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright
from playwright.async_api import expect as expect

ROOT = Path(__file__).resolve().parents[2]

BROWSER_SETTING = "EVENTOS_TEST_BROWSER"
DEBIAN_CHROMIUM = Path("/usr/bin/chromium")
# What a browser needs in a container with no display, sandbox or network but loopback.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run"]  # fmt: skip
SHOTS = ROOT / "test-output" / "console"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
WAIT_MS = 60_000  # a loaded two-core machine: generous, and only ever a deadline


def browser_executable() -> str | None:
    """The Chromium to drive (None: Playwright's own download)."""
    chosen = os.environ.get(BROWSER_SETTING)
    if chosen:
        return chosen
    return str(DEBIAN_CHROMIUM) if DEBIAN_CHROMIUM.exists() else None


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium per test session (each test has its own context)."""
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=browser_executable(), args=FLAGS)
        yield launched
        await launched.close()


@dataclass
class Console:
    """One browser tab on the console, with what it must never do recorded as it goes: a
    script error, a Content-Security-Policy refusal, content in a URL."""

    page: Page
    base: str
    phone: bool = False
    errors: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def watch(self) -> None:
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.page.on("console", self._console)
        self.page.on("request", lambda req: self.urls.append(req.url))
        self.page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)

    def _console(self, message: object) -> None:
        text = getattr(message, "text", "")
        if re.search(r"Content.Security.Policy|Refused to", text):
            self.errors.append(f"refused: {text}")

    async def sign_in(self, token: str) -> None:
        """Type the token on the sign-in page, as a person would."""
        await self.page.goto(f"{self.base}/console")
        await self.page.get_by_label("Token").fill(token)
        await self.page.get_by_role("button", name="Sign in").click()
        await expect(self.page.get_by_role("button", name="Sign out")).to_be_visible()

    async def open(self, *route: str) -> None:
        """Go to a console page by its hash route."""
        await self.page.evaluate("r => { location.hash = r }", "#/" + "/".join(route))

    async def shot(self, name: str) -> Path:
        """Save the page as it is now under test-output/console/: a desktop tab's as NAME.png
        and, at a phone's width, NAME-phone.png; a phone tab's as NAME.png only."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=True)
        if not self.phone:
            await self.page.set_viewport_size(PHONE)  # type: ignore[arg-type]
            await self.page.screenshot(path=str(SHOTS / f"{name}-phone.png"), full_page=True)
            await self.page.set_viewport_size(DESKTOP)  # type: ignore[arg-type]
        return path

    def check_clean(self, *secrets: str) -> None:
        """No script error or CSP refusal happened, and no URL carried a secret or content."""
        assert self.errors == [], self.errors
        for url in self.urls:
            for secret in secrets:
                assert secret not in url, f"{secret!r} appeared in {url}"


@dataclass
class Tabs:
    """Opens console tabs, each in a browser context of its own (its own sessionStorage)."""

    browser: Browser
    opened: list[Console] = field(default_factory=list)

    async def open(self, base: str, viewport: dict[str, int] = DESKTOP,
                   timezone: str | None = None) -> Console:  # fmt: skip
        """A tab at this size, in this time zone (None: the machine's)."""
        context = await self.browser.new_context(viewport=viewport, timezone_id=timezone)  # type: ignore[arg-type]
        console = Console(await context.new_page(), base, phone=viewport == PHONE)
        console.watch()
        self.opened.append(console)
        return console


@pytest.fixture
async def tabs(browser: Browser) -> AsyncIterator[Tabs]:
    """The test's tabs, closed at its end."""
    made = Tabs(browser)
    yield made
    for console in made.opened:
        await console.page.context.close()
