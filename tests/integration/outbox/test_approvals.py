"""Approvals of sends on the real stack (issue 14, SPEC §11): a Telegram reply held until the
owner decides; approve, decline, the reminder and expiry on deadlines the test moves, a
decision taken while stopped sent on Resume, and approved sends in decision order."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from channel_stack import Stack, egress_running, now, telegram_stack
from psycopg_pool import AsyncConnectionPool
from test_router import query

from eventos import names
from eventos.db import Conn
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox import approvals
from eventos.outbox.keys import OutboxKeys
from eventos.settings import DatabaseSettings, TemporalSettings
from eventos.testing import wait_for

APPROVE_TELEGRAM = "  approvals: {sends: [telegram], expire_after_h: 48}\n"


@pytest.fixture
async def stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, spec_extra=APPROVE_TELEGRAM) as s:  # fmt: skip
        yield s


async def held(s: Stack, chat_id: int, text: str) -> dict[str, Any]:
    """A customer writes; the reply is held for approval: its pending approval."""
    s.fake.customer_message(s.token, chat_id, text)

    async def pending() -> dict[str, Any] | None:
        r = await s.api.get("/v1/approvals", params={"state": "pending"})
        rows = [a for a in r.json()["approvals"] if text in (a["draft"] or "")]
        return rows[0] if rows else None

    return await wait_for(pending, timeout=60, interval=0.1, what=f"the approval of {text!r}")


async def approval_row(s: Stack, ident: str) -> dict[str, Any]:
    (row,) = await query(s.pool, f"SELECT * FROM approvals WHERE id = '{ident}'")
    return row


async def nudge(s: Stack, ident: str) -> None:
    """Nudge the approval's workflow (it starts just after the row commits)."""
    await wait_for(lambda: approvals.nudge(s.client, ident), timeout=30, what="the nudge taken")


async def test_an_approved_reply_is_sent_once_and_a_declined_one_never(stack: Stack) -> None:
    s = stack
    async with egress_running(s):
        yes = await held(s, 111, "please approve me")
        no = await held(s, 222, "please decline me")
        (row,) = [r for r in await s.outbox() if r["approval_id"] == yes["id"]]
        assert (row["status"], row["held_reason"]) == ("held", names.APPROVAL_HELD)
        assert s.fake.sent(s.token) == []  # nothing leaves before the decision

        r = await s.api.post(f"/v1/approvals/{yes['id']}:approve")
        assert r.status_code == 202, r.text
        assert r.json()["state"] == names.APPROVAL_APPROVED
        sent = await wait_for(now(lambda: s.fake.sent(s.token, 111) or None), timeout=30,
                              what="the approved reply sent")  # fmt: skip
        r = await s.api.post(f"/v1/approvals/{no['id']}:decline")
        assert r.status_code == 202, r.text

        async def settled() -> bool:
            rows = {a["id"]: a for a in (await s.api.get("/v1/approvals")).json()["approvals"]}
            return rows[no["id"]]["send_status"] == "failed" and bool(rows[yes["id"]]["taken_at"])

        await wait_for(settled, timeout=30, what="both decisions taken")
    assert len(sent) == 1 and "please approve me" in sent[0]["text"]
    assert s.fake.sent(s.token, 222) == []
    again = await s.api.post(f"/v1/approvals/{yes['id']}:decline")
    assert again.status_code == 409  # decided once


async def test_a_user_decides_only_their_own_approvals(stack: Stack) -> None:
    s = stack
    ap = await held(s, 333, "an admin matter")
    r = await s.api.post("/v1/users", json={"name": "mallory"})
    token = r.json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    listed = await s.api.get("/v1/approvals", headers=headers)
    assert listed.status_code == 200 and listed.json()["approvals"] == []
    refused = await s.api.post(f"/v1/approvals/{ap['id']}:approve", headers=headers)
    assert refused.status_code == 404  # not theirs: not even its existence shows
    assert (await approval_row(s, ap["id"]))["state"] == names.APPROVAL_PENDING


async def test_one_reminder_24_hours_before_expiry_then_expiry(stack: Stack) -> None:
    s = stack
    ap = await held(s, 444, "decide me in time")
    assert (await approval_row(s, ap["id"]))["reminded_at"] is None
    # The deadline the workflow reads from the row, moved to 24 h and 2 s from now.
    async with s.pool.connection() as conn:
        await conn.execute("UPDATE approvals SET expires_at = now() + interval '24 hours 2 s' "
                           "WHERE id = %s", (ap["id"],))  # fmt: skip
    await nudge(s, ap["id"])

    async def reminded() -> list[dict[str, Any]] | None:
        return await s.attention(names.ATTENTION_APPROVAL_EXPIRING) or None

    (item,) = await wait_for(reminded, timeout=30, what="the reminder")
    assert item["ref"] == f"approval#{ap['id']}" and "expires at" in item["detail"]
    async with s.pool.connection() as conn:
        await conn.execute("UPDATE approvals SET expires_at = now() + interval '1 s' "
                           "WHERE id = %s", (ap["id"],))  # fmt: skip
    await nudge(s, ap["id"])

    async def expired() -> bool:
        row = await approval_row(s, ap["id"])
        return row["state"] == names.APPROVAL_EXPIRED and row["taken_at"] is not None

    await wait_for(expired, timeout=30, what="the approval expired and taken")
    assert len(await s.attention(names.ATTENTION_APPROVAL_EXPIRING)) == 1  # one reminder
    assert len(await s.attention(names.ATTENTION_APPROVAL_EXPIRED)) == 1
    (row,) = [r for r in await s.outbox() if r["approval_id"] == ap["id"]]
    assert row["status"] == "expired"
    assert s.fake.sent(s.token) == []


async def intent_applied(s: Stack, intent: dict[str, Any]) -> None:
    async def applied() -> bool:
        r = await s.api.get(f"/v1/intents/{intent['id']}")
        return bool(r.json()["state"] == "applied")

    await wait_for(applied, timeout=30, what=f"intent {intent['id']} applied")


async def test_stop_completes_while_a_draft_waits_and_the_decision_is_sent_on_resume(
    stack: Stack,
) -> None:
    s = stack
    async with egress_running(s):
        ap = await held(s, 555, "wait for me")
        r = await s.api.post(f"/v1/employees/{s.name}:stop", json={})
        assert r.status_code == 202, r.text
        await intent_applied(s, r.json()["intent"])

        async def turn_over() -> bool:  # the turn closed and gave its lease back
            q = f"SELECT 1 FROM sched_leases WHERE employee = '{s.name}'"
            return await query(s.pool, q) == []

        await wait_for(turn_over, timeout=30, what="the stopped turn over (it did not wait)")
        r = await s.api.post(f"/v1/approvals/{ap['id']}:approve")  # decided while stopped
        assert r.status_code == 202, r.text
        # The approvals watchdog looks at decisions nobody took for 10 s (moved back here).
        async with s.pool.connection() as conn:
            await conn.execute("UPDATE approvals SET decided_at = decided_at - interval '1 min' "
                               "WHERE id = %s", (ap["id"],))  # fmt: skip
            assert await approvals.watch_once(conn, s.client) == 0  # stopped: it waits
        assert (await approval_row(s, ap["id"]))["taken_at"] is None
        assert s.fake.sent(s.token) == []

        r = await s.api.post(f"/v1/employees/{s.name}:resume", json={})
        assert r.status_code == 202, r.text
        await intent_applied(s, r.json()["intent"])
        async with s.pool.connection() as conn:
            assert await approvals.watch_once(conn, s.client) == 1
        sent = await wait_for(now(lambda: s.fake.sent(s.token, 555) or None), timeout=30,
                              what="the decision sent on Resume")  # fmt: skip
    assert len(sent) == 1 and "wait for me" in sent[0]["text"]


async def test_approved_sends_go_out_in_decision_order(stack: Stack) -> None:
    s = stack
    async with egress_running(s):
        first = await held(s, 666, "written first")
        second = await held(s, 777, "written second")
        for ap in (second, first):  # the owner approves the later one first
            r = await s.api.post(f"/v1/approvals/{ap['id']}:approve")
            assert r.status_code == 202, r.text

        async def both() -> list[dict[str, Any]] | None:
            sent = s.fake.sent(s.token)
            return sent if len(sent) == 2 else None

        sent = await wait_for(both, timeout=30, what="both approved sends")
    assert [m["chat"]["id"] for m in sent] == [777, 666]


RULES = """  content_rules:
    - {id: no-refunds, kind: keyword, words: [refund]}
    - {id: rivals, kind: domain, domains: [rival.example]}
"""


async def test_a_content_rule_holds_a_reply_with_its_id_only_until_the_owner_releases_it(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> None:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, spec_extra=RULES) as s, egress_running(s):  # fmt: skip
        ap = await held(s, 888, "I want a refund, see www.rival.example/deal")
        (row,) = await s.outbox()
        assert (row["status"], row["held_reason"]) == ("held", "no-refunds,rivals")
        assert s.fake.sent(s.token) == []
        s.fake.customer_message(s.token, 999, "just saying hello")  # no rule matches it
        await wait_for(now(lambda: s.fake.sent(s.token, 999) or None), timeout=30,
                       what="the reply no rule holds")  # fmt: skip
        r = await s.api.post(f"/v1/approvals/{ap['id']}:approve")  # the owner releases it
        assert r.status_code == 202, r.text
        sent = await wait_for(now(lambda: s.fake.sent(s.token, 888) or None), timeout=30,
                              what="the released reply")  # fmt: skip
    assert len(sent) == 1


async def test_a_tool_call_that_needs_approval_runs_only_once_approved(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> None:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, spec_extra="  approvals: {tools: [set_alarm]}\n",
                              tools=("set_alarm",)) as s, egress_running(s):  # fmt: skip

        async def alarms() -> list[dict[str, Any]]:
            return await query(s.pool, f"SELECT text FROM alarms WHERE employee = '{s.name}'")

        async def pending_call(text: str) -> dict[str, Any] | None:
            r = await s.api.get("/v1/approvals", params={"state": "pending"})
            rows = [a for a in r.json()["approvals"] if text in (a["draft"] or "")]
            return rows[0] if rows else None

        for chat, words, verb in [(1313, "call the bank", "approve"),
                                  (1414, "call the zoo", "decline")]:  # fmt: skip
            args = json.dumps({"text": words, "in_s": 3600})
            s.fake.customer_message(s.token, chat, f"remind me\ncall: set_alarm {args}")
            ap = await wait_for(lambda w=words: pending_call(w), timeout=60,
                                what=f"the approval of {words!r}")  # fmt: skip
            assert ap["draft"].startswith("set_alarm ") and ap["channel"] is None
            assert ap["rule"] == "approvals.tools: set_alarm" and ap["turn_id"]  # issue 26
            assert words not in [a["text"] for a in await alarms()]  # not made before
            assert s.fake.sent(s.token, chat) == []  # the turn waits for the decision
            r = await s.api.post(f"/v1/approvals/{ap['id']}:{verb}")
            assert r.status_code == 202, r.text
            await wait_for(now(lambda c=chat: s.fake.sent(s.token, c) or None), timeout=60,
                           what="the turn's reply after the decision")  # fmt: skip
        assert [a["text"] for a in await alarms()] == ["call the bank"]  # the declined one never
