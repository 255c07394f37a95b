"""The operator event stream (`GET /v1/events`) and the chat stream over real HTTP on real
PostgreSQL: state changes arrive as events of their place, a transaction that commits late is
delivered once after what committed before it (to a reader that stayed and to one that
reconnected with Last-Event-ID), a user's stream never shows another audience's events, and
the stream's refusals."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from event_streams import labels, listen, now_at
from psycopg_pool import AsyncConnectionPool
from test_attention_api import Items, items  # noqa: F401 (a fixture)
from test_router import query
from test_users import user_thread

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.operator import events as operator_events

RAISE = Q["attention_raise"]


def raised(kind: str, ref: str = "support") -> dict[str, Any]:
    return {"employee": "support", "kind": kind, "severity": "warning", "ref": ref,
            "detail": f"{kind} happened"}  # fmt: skip


async def test_a_late_commit_is_delivered_once_after_what_committed_before_it(
    items: Items,  # noqa: F811
    pool: AsyncConnectionPool[Conn],
) -> None:
    stays = await listen(items.admin, kind="attention")
    drops = await listen(items.admin, kind="attention")
    async with pool.connection() as late, late.transaction():
        # Written first (its row id is the lower), committed last.
        await late.execute(RAISE, raised(names.ATTENTION_SLOW_TURN, "turn-late"))
        await items.raise_item(names.ATTENTION_BUDGET_HIGH, "support")
        await items.raise_item(names.ATTENTION_BUDGET_MAX, "support")
        later = ["attention.raised budget_high", "attention.raised budget_max"]
        for heard in (stays, drops):
            await heard.until("the later events", lambda e: labels(e) == later)
        await drops.close()
        resume_at = drops.last_id
    late_one = "attention.raised slow_turn"
    await stays.until("the late event", lambda e: labels(e) == [*later, late_one])
    again = await listen(items.admin, last=resume_at, kind="attention")
    await again.until("the late event, after a reconnect", lambda e: labels(e) == [late_one])

    # Nothing is delivered twice: from the late event's place on, only what comes next.
    after_late = await listen(items.admin, last=again.events()[-1][0], kind="attention")
    await items.raise_item(names.ATTENTION_PARKED_TURN, "turn-next")
    nxt = "attention.raised parked_turn"
    for heard in (stays, again, after_late):
        await heard.until("the next event", lambda e: labels(e)[-1:] == [nxt])
    assert labels(stays.events()) == [*later, late_one, nxt]
    assert labels(again.events()) == [late_one, nxt]
    assert labels(after_late.events()) == [nxt]
    places = [p for p, _, _ in stays.events()]
    assert places == sorted(places) and len(set(places)) == 4
    for heard in (stays, again, after_late):
        await heard.close()


async def ann_turn(pool: AsyncConnectionPool[Conn], thread: str, n: int) -> str:
    """A turn on `thread` that ends `done` (its timeline entry tells the stream)."""
    turn = f"turn-{uuid.uuid4().hex[:8]}"
    async with pool.connection() as conn:
        await conn.execute("INSERT INTO turns (id, employee, generation, agent, thread, n, class, "
                           "stream_key) VALUES (%s, 'support', 1, 'front', %s, %s, 1, %s)",
                           (turn, thread, n, f"support/1/talk/{thread}"))  # fmt: skip
        await conn.execute("UPDATE turns SET status = 'done' WHERE id = %s", (turn,))
    return turn


async def test_a_users_stream_shows_only_its_own_audience(
    items: Items,  # noqa: F811
    pool: AsyncConnectionPool[Conn],
) -> None:
    start = await now_at(items.admin)
    ann_thread, bob_thread = await user_thread(pool, "ann"), await user_thread(pool, "bob")
    await items.raise_item(names.ATTENTION_BUDGET_HIGH, "support")  # the admin's alone
    await items.raise_item(names.ATTENTION_DEAD_INPUT, f"{items.stream}#1-1")  # ann's
    (dead,) = await items.listed(items.user)
    await items.post(dead["id"], "ack", api=items.user)
    async with pool.connection() as conn:
        await conn.execute(Q["approval_insert_tool"], {
            "id": "appr-ann", "employee": "support", "generation": 1, "thread": ann_thread,
            "turn_id": "turn-a", "tool_call": "turn-a:1", "draft": "SECRET DRAFT",
            "audience": "ann", "expire_after_h": 1})  # fmt: skip
        await conn.execute(Q["outbound_insert"], {
            "key": "out-ann", "employee": "support", "thread": ann_thread, "turn_id": "turn-a",
            "account": None, "recipient": None, "recipient_key_id": None, "kind": "chat",
            "class": 1, "body": "SECRET BODY", "audience": "ann"})  # fmt: skip
    r = await items.user.post("/v1/approvals/appr-ann:approve")
    assert r.status_code == 202, r.text
    ann_done = await ann_turn(pool, ann_thread, 1)
    await items.raise_item(names.ATTENTION_BUDGET_MAX, "support")  # the admin's alone
    bob_done = await ann_turn(pool, bob_thread, 1)

    admin = await listen(items.admin, last=start)
    ann = await listen(items.user, last=start)
    bob = await listen(items.stranger, last=start)
    await admin.until("bob's turn", lambda e: any(d["ref"] == bob_done for _, _, d in e))
    await ann.until("ann's turn", lambda e: any(d["ref"] == ann_done for _, _, d in e))
    await bob.until("bob's turn", lambda e: any(d["ref"] == bob_done for _, _, d in e))
    seen = {name: [(k, d["ref"], d["state"]) for _, k, d in heard.events()]
            for name, heard in (("admin", admin), ("ann", ann), ("bob", bob))}  # fmt: skip
    assert seen["ann"] == [
        ("attention.raised", str(dead["id"]), "open"),
        ("attention.acked", str(dead["id"]), "acked"),
        ("approval.created", "appr-ann", "pending"),
        ("outbox.queued", seen["ann"][3][1], "queued"),
        ("approval.decided", "appr-ann", "approved"),
        ("turn.done", ann_done, "done"),
    ]
    assert seen["bob"] == [("turn.done", bob_done, "done")]
    assert set(seen["ann"]) | set(seen["bob"]) < set(seen["admin"])
    assert [k for k, _, _ in seen["admin"]].count("attention.raised") == 3
    for heard in (admin, ann, bob):
        text = "\n".join(heard.raw)
        assert "SECRET" not in text and "happened" not in text  # ids and states, no content
        await heard.close()


async def test_what_the_stream_refuses(items: Items, ingress_url: str) -> None:  # noqa: F811
    api = items.admin
    for headers, params, status, path in [
        ({"Last-Event-ID": "-1"}, {}, 400, "Last-Event-ID"),
        ({"Last-Event-ID": "99999999999"}, {}, 400, "Last-Event-ID"),
        ({}, {"kind": "turn,weather"}, 400, "kind"),
        ({}, {"after": "1e3"}, 400, "Last-Event-ID"),
    ]:
        r = await api.get("/v1/events", headers=headers, params=params)
        assert r.status_code == status, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert [e["path"] for e in r.json()["errors"]] == [path]
    async with httpx.AsyncClient(base_url=ingress_url) as anonymous:
        assert (await anonymous.get("/v1/events")).status_code == 401


async def test_past_the_retention_a_resume_is_told_it_is_gone(
    items: Items,  # noqa: F811
    pool: AsyncConnectionPool[Conn],
) -> None:
    start = await now_at(items.admin)
    await items.raise_item(names.ATTENTION_BUDGET_HIGH, "support")
    await items.raise_item(names.ATTENTION_BUDGET_MAX, "support")
    heard = await listen(items.admin, last=start)
    (first, _), (second, _) = [(p, k) for p, k, _ in
                               await heard.until("both", lambda e: len(e) == 2)]  # fmt: skip
    await heard.close()
    async with pool.connection() as conn:
        await conn.execute("UPDATE operator_events SET at = now() - interval '8 days' "
                           "WHERE pos = %s", (first,))  # fmt: skip
        assert await operator_events.expire(conn) == 1
    r = await items.admin.get("/v1/events", headers={"Last-Event-ID": str(start)})
    assert r.status_code == 410 and "retention" in r.json()["detail"]
    rest = await listen(items.admin, last=first)  # from the place deleted on: nothing is lost
    await rest.until("the second", lambda e: [p for p, _, _ in e] == [second])
    await rest.close()
    assert await query(pool, "SELECT through FROM operator_events_pruned") == [{"through": first}]


async def test_a_late_chat_reply_is_streamed_once(
    items: Items,  # noqa: F811
    pool: AsyncConnectionPool[Conn],
) -> None:
    """The chat stream reads by place too: a reply whose transaction commits after a later run
    event is not skipped by a reader that passed the run event, nor sent twice."""
    path = "/v1/employees/support/chat/events"
    insert = ("INSERT INTO chat_events (employee, audience, session, kind, turn_id, dedupe_key, "
              "text) VALUES ('support', 'ann', 'owner', %s, %s, %s, %s)")  # fmt: skip
    stays = await listen(items.user, path, after=0)
    async with pool.connection() as late, late.transaction():
        await late.execute(insert, ("reply", "t-1", "late", "the late reply"))
        async with pool.connection() as conn:
            await conn.execute(insert, ("run.start", "t-2", "early", None))
        await stays.until("the run event", lambda e: [k for _, k, _ in e] == ["run.start"])
        drops_at = stays.last_id
        await stays.close()
    again = await listen(items.user, path, last=drops_at)
    found = await again.until("the late reply", lambda e: len(e) == 1)
    assert [(k, d.get("text")) for _, k, d in found] == [("reply", "the late reply")]
    whole = await listen(items.user, path, after=0)
    found = await whole.until("both", lambda e: len(e) == 2)
    assert [k for _, k, _ in found] == ["run.start", "reply"]
    bob = await listen(items.stranger, path, after=0)
    assert json.dumps(bob.events()) == "[]"  # ann's session is hers alone
    for heard in (again, whole, bob):
        await heard.close()


@pytest.mark.parametrize("family", sorted(names.OPERATOR_EVENT_KINDS))
def test_every_family_and_kind_is_accepted_as_a_filter(family: str) -> None:
    assert operator_events.parse_kinds(family) == (family,)
    for kind in names.OPERATOR_EVENT_KINDS[family]:
        assert operator_events.parse_kinds(f" {kind} ,{family}") == (kind, family)
