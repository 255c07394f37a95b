"""Attention items over real HTTP on real PostgreSQL (SPEC §12): listed newest first with their
filters and pages, acknowledged (a repeat counts on the acked item), resolved by hand or by
their cause, and seen and handled by a user only when they are about the user's own chat."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN
from psycopg_pool import AsyncConnectionPool
from test_router import query
from test_users import user_thread

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.delivery.routing import route_pass
from eventos.owner import users

PROBLEM = "application/problem+json"


@dataclass
class Items:
    pool: AsyncConnectionPool[Conn]
    admin: httpx.AsyncClient
    user: httpx.AsyncClient  # `ann`, who chatted with `support`
    stranger: httpx.AsyncClient  # `bob`, who did not
    stream: str  # ann's chat stream

    async def raise_item(self, kind: str, ref: str, employee: str = "support") -> None:
        """The code's own raise (its audience found from the ref, as every raise does)."""
        async with self.pool.connection() as conn:
            await conn.execute(Q["attention_raise"], {"employee": employee, "kind": kind,
                                                      "severity": "warning", "ref": ref,
                                                      "detail": f"{kind} happened"})  # fmt: skip

    async def listed(self, api: httpx.AsyncClient | None = None, **params: str) -> list[Any]:
        r = await (api or self.admin).get("/v1/attention", params=params)
        assert r.status_code == 200, r.text
        return list(r.json()["attention"])

    async def post(self, item: int, verb: str, status: int = 200,
                   api: httpx.AsyncClient | None = None, **body: Any) -> dict[str, Any]:  # fmt: skip
        r = await (api or self.admin).post(f"/v1/attention/{item}:{verb}", json=body)
        assert r.status_code == status, r.text
        if status >= 400:
            assert r.headers["content-type"] == PROBLEM
        return dict(r.json())


def client(url: str, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"},
                             timeout=10)  # fmt: skip


@pytest.fixture
async def items(
    started: str, pool: AsyncConnectionPool[Conn], ingress_url: str
) -> AsyncIterator[Items]:
    async with client(ingress_url, ADMIN_TOKEN) as admin:
        tokens = {}
        for name in ("ann", "bob"):
            tokens[name] = (await admin.post("/v1/users", json={"name": name})).json()["token"]
        async with client(ingress_url, tokens["ann"]) as ann, \
                client(ingress_url, tokens["bob"]) as bob:  # fmt: skip
            body = {"client_message_id": uuid.uuid4().hex, "text": "hi"}
            assert (await ann.post(f"/v1/employees/{started}/chat", json=body)).status_code == 202
            async with pool.connection() as conn:
                await route_pass(conn)
            thread = await user_thread(pool, "ann")
            stream = names.stream_key(started, 1, names.LANE_TALK, thread)
            yield Items(pool, admin, ann, bob, stream)


async def test_items_are_listed_acked_counted_and_resolved(items: Items) -> None:
    await items.raise_item(names.ATTENTION_SLOW_TURN, "turn-1")
    await items.raise_item(names.ATTENTION_BUDGET_HIGH, "support")
    await items.raise_item(names.ATTENTION_DEAD_INPUT, f"{items.stream}#1-1")
    dead, high, slow = await items.listed()
    assert [dead["kind"], high["kind"], slow["kind"]] == ["dead_input", "budget_high", "slow_turn"]
    assert (dead["state"], dead["count"], dead["actions"], dead["audience"]) == (
        "open", 1, ["replay"], "ann")  # fmt: skip
    assert (high["actions"], high["audience"], high["detail"]) == ([], None, "budget_high happened")

    acked = await items.post(dead["id"], "ack")
    assert (acked["state"], acked["acked_by"]) == ("acked", users.OWNER)
    assert (await items.post(dead["id"], "ack"))["state"] == "acked"  # again: unchanged
    await items.raise_item(names.ATTENTION_DEAD_INPUT, f"{items.stream}#1-1")  # a repeat
    (again,) = await items.listed(kind="dead_input")
    assert (again["id"], again["state"], again["count"]) == (dead["id"], "acked", 2)

    assert [i["kind"] for i in await items.listed(state="open")] == ["budget_high", "slow_turn"]
    assert len(await items.listed(state="open,acked")) == 3
    assert await items.listed(employee="nobody") == []
    # Its cause going away resolves an acked item as well as an open one.
    await items.post(high["id"], "ack")
    async with items.pool.connection() as conn:
        await conn.execute(Q["attention_resolve"], {"kind": high["kind"], "ref": "support"})
    (gone,) = await items.listed(state="resolved")
    assert (gone["id"], gone["resolved_by"], gone["actions"]) == (high["id"], None, [])

    done = await items.post(dead["id"], "resolve")
    assert (done["state"], done["resolved_by"], done["actions"]) == ("resolved", "owner", [])
    for verb, body in (("resolve", {}), ("ack", {}), ("act", {"action": "replay"})):
        refused = await items.post(dead["id"], verb, status=409, **body)
        assert "is resolved" in refused["detail"]
    await items.raise_item(names.ATTENTION_DEAD_INPUT, f"{items.stream}#1-1")  # a new one
    newest = (await items.listed(kind="dead_input"))[0]
    assert newest["id"] != dead["id"] and (newest["state"], newest["count"]) == ("open", 1)


async def test_items_page_with_a_cursor_and_refuse_bad_input(items: Items) -> None:
    for n in range(5):
        await items.raise_item(names.ATTENTION_SLOW_TURN, f"turn-{n}")
    seen, cursor = [], None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await items.admin.get("/v1/attention", params=params)).json()
        seen += [i["ref"] for i in page["attention"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"turn-{n}" for n in reversed(range(5))]
    for bad in ({"state": "closed"}, {"limit": "500"}, {"cursor": "!!"}):
        r = await items.admin.get("/v1/attention", params=bad)
        assert r.status_code == 400 and r.headers["content-type"] == PROBLEM, bad
    for path in ("/v1/attention/abc:ack", "/v1/attention/999999:ack", "/v1/attention/1:close"):
        r = await items.admin.post(path, json={})
        assert r.status_code == 404 and r.headers["content-type"] == PROBLEM, path
    (item,) = (await items.listed())[:1]
    unknown = await items.post(item["id"], "act", status=400, action="dance")
    assert unknown["errors"][0]["path"] == "action"
    none = await items.post(item["id"], "act", status=409, action="replay")
    assert "offers no 'replay'" in none["detail"]


async def test_a_user_sees_and_handles_only_the_items_of_their_own_chat(items: Items) -> None:
    await items.raise_item(names.ATTENTION_BUDGET_HIGH, "support")
    await items.raise_item(names.ATTENTION_PARKED_TURN, f"{items.stream}#turn")
    admins, parked = await items.listed(kind="budget_high"), await items.listed(kind="parked_turn")
    mine = await items.listed(items.user)
    assert [i["id"] for i in mine] == [parked[0]["id"]]
    # Resume changes the employee as a whole: the admin's to take, not the user's.
    assert (parked[0]["actions"], mine[0]["actions"]) == (["resume"], [])
    assert await items.listed(items.stranger) == []
    other = admins[0]["id"]
    for verb, body in (("ack", {}), ("resolve", {}), ("act", {"action": "resume"})):
        await items.post(other, verb, status=404, api=items.user, **body)
        await items.post(parked[0]["id"], verb, status=404, api=items.stranger, **body)
    assert (await items.user.get(f"/v1/attention/{other}")).status_code == 404
    refused = await items.post(parked[0]["id"], "act", status=409, api=items.user,
                               action="resume")  # fmt: skip
    assert "offers no 'resume' to this caller" in refused["detail"]
    acked = await items.post(parked[0]["id"], "ack", api=items.user)
    assert (acked["state"], acked["acked_by"]) == ("acked", "ann")
    rows = await query(items.pool, "SELECT state FROM attention_items WHERE id = %s", other)
    assert rows == [{"state": "open"}]  # nothing the others tried changed it
