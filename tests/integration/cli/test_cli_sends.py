"""`eventosctl approvals [approve|decline ID]` and `eventosctl outbox [retry ID]` against the
real Telegram stack (issue 14): what the owner sees, and what each command did to the rows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from channel_stack import Stack, egress_running, now, telegram_stack
from conftest import ADMIN_TOKEN
from psycopg_pool import AsyncConnectionPool
from test_approvals import APPROVE_TELEGRAM, approval_row, held
from test_router import query

from eventos import names
from eventos.cli import main
from eventos.db import Conn
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.keys import OutboxKeys
from eventos.settings import DatabaseSettings, TemporalSettings
from eventos.testing import wait_for


@pytest.fixture(autouse=True)
def no_ambient_instance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EVENTOS_URL", "EVENTOS_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


async def ctl(s: Stack, *argv: str) -> int:
    """main() in a thread: the stack's ingress serves on this test's event loop."""
    url = str(s.api.base_url).rstrip("/")
    return await asyncio.to_thread(main, [*argv, "--url", url, "--token", ADMIN_TOKEN])


@pytest.fixture
async def approving(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, spec_extra=APPROVE_TELEGRAM) as s:  # fmt: skip
        yield s


@pytest.fixture
async def stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints) as s:  # fmt: skip
        yield s


async def test_approvals_lists_approves_and_declines(
    approving: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    s = approving
    async with egress_running(s):
        yes = await held(s, 811, "approve me from the shell")
        no = await held(s, 822, "decline me from the shell")
        capsys.readouterr()
        assert await ctl(s, "approvals") == 0
        out = capsys.readouterr().out
        for ap in (yes, no):
            assert f"{ap['id']}  pending" in out
        assert "approve me from the shell" in out and "decline me from the shell" in out

        assert await ctl(s, "approvals", "approve", yes["id"]) == 0
        assert capsys.readouterr().out.strip() == (
            f"approval/{yes['id']} approved; its send follows the decision"
        )
        assert (await approval_row(s, yes["id"]))["state"] == names.APPROVAL_APPROVED
        sent = await wait_for(now(lambda: s.fake.sent(s.token, 811) or None), timeout=60,
                              what="the approved reply sent")  # fmt: skip
        assert await ctl(s, "approvals", "decline", no["id"]) == 0
        assert capsys.readouterr().out.strip() == (
            f"approval/{no['id']} declined; its send follows the decision"
        )
        assert (await approval_row(s, no["id"]))["state"] == names.APPROVAL_DECLINED

        assert await ctl(s, "approvals", "--state", "approved") == 0
        out = capsys.readouterr().out
        assert yes["id"] in out and no["id"] not in out
        assert await ctl(s, "approvals", "approve", no["id"]) != 0  # decided once
        assert await ctl(s, "approvals", "approve") != 0  # no ID: a usage error
    assert len(sent) == 1 and s.fake.sent(s.token, 822) == []


async def test_outbox_lists_rows_and_retry_sends_an_unknown_one_again(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    s = stack
    s.fake.cut_next(s.token, 1, applied=True)  # Telegram sent it; its answer never arrived
    async with egress_running(s):
        s.fake.customer_message(s.token, 833, "did it go?")
        row = await s.one_outbox("unknown")
        capsys.readouterr()
        assert await ctl(s, "outbox", "--status", "unknown") == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].split()[:5] == ["ID", "EMPLOYEE", "KIND", "STATUS", "UPDATED"]
        (line,) = out[1:]
        assert line.split()[:4] == [str(row["id"]), s.name, "telegram", "unknown"]
        assert "833" not in line  # the recipient never shows
        assert await ctl(s, "outbox", "--status", "sent") == 0
        assert capsys.readouterr().out.splitlines()[-1] == "the outbox is empty (sent)"

        assert await ctl(s, "outbox", "retry", str(row["id"])) == 0
        assert capsys.readouterr().out.strip() == (
            f"outbox/{row['id']} queued again; the egress sends it once"
        )
        await s.one_outbox("sent")
    assert len(s.fake.sent(s.token, 833)) == 2  # the cut send, and Retry's: once each
    (done,) = await query(s.pool, f"SELECT status FROM outbound_messages WHERE id = {row['id']}")
    assert done["status"] == "sent"
    assert await ctl(s, "outbox", "retry", str(row["id"])) != 0  # a sent row is not retried
    assert await ctl(s, "outbox", "retry", "abc") != 0
