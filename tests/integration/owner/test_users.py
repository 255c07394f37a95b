"""Users and audiences on the owner API: tokens, what a user may do, whose chat is whose."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN
from psycopg_pool import AsyncConnectionPool
from test_owner_api_edges import problem_of
from test_router import query, route_until_done

from eventos.contracts import DeadLetter
from eventos.conversations import turns
from eventos.db import Conn
from eventos.owner import users

Client = httpx.AsyncClient


@pytest.fixture
async def admin(ingress_url: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=10) as c:
        yield c


async def add_user(admin: Client, name: str) -> str:
    r = await admin.post("/v1/users", json={"name": name})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == name
    token = r.json()["token"]
    assert isinstance(token, str) and token.startswith(users.TOKEN_PREFIX)
    return token


async def user_thread(pool: AsyncConnectionPool[Conn], name: str) -> str:
    """The owner-chat thread of the user now holding `name` (it derives from its record's id)."""
    (row,) = await query(pool, "SELECT thread FROM users WHERE name = %s", name)
    return str(row["thread"])


def as_user(ingress_url: str, token: str) -> Client:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=10)


async def say(api: Client, cid: str, text: str, session: str | None = None) -> int:
    body: dict[str, Any] = {"client_message_id": cid, "text": text}
    if session is not None:
        body["session"] = session
    r = await api.post("/v1/employees/support/chat", json=body)
    assert r.status_code == 202, r.text
    return int(r.json()["message_id"])


async def test_users_are_created_listed_and_removed_by_the_admin_only(
    started: str, admin: Client, ingress_url: str, pool: AsyncConnectionPool[Conn]
) -> None:
    token = await add_user(admin, "alice")
    (row,) = await query(pool, "SELECT * FROM users")
    assert row["token_sha256"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in str(row)  # only its hash is kept
    assert row["thread"] == users.thread_of(str(row["id"])) and row["thread"].startswith("u_")
    listed = (await admin.get("/v1/users")).json()["users"]
    assert [u["name"] for u in listed] == ["alice"] and "token" not in listed[0]
    assert listed[0]["id"] == str(row["id"])
    problem_of(await admin.post("/v1/users", json={"name": "alice"}), 409, "conflict")
    problem_of(await admin.post("/v1/users", json={"name": "owner"}), 409, "conflict")
    for bad in ({"name": "Alice!"}, {"name": ""}, {"name": 3}, {}):
        r = await admin.post("/v1/users", json=bad)
        assert problem_of(r, 400, "invalid-request")["errors"] == [
            {"path": "name", "message": r.json()["errors"][0]["message"]}
        ]
    async with as_user(ingress_url, token) as alice:
        # A user token may chat; every other operation is the admin's.
        admin_only = [
            ("POST", "/v1/users", {"name": "mallory"}), ("GET", "/v1/users", None),
            ("DELETE", "/v1/users/alice", None), ("GET", "/v1/employees", None),
            ("GET", "/v1/employees/support", None), ("POST", "/v1/employees", {"kind": "x"}),
            ("POST", "/v1/employees/support:stop", None), ("POST", "/v1/rearm", None),
            ("POST", "/v1/employees/support:interrupt", {}), ("GET", "/v1/intents/1", None),
            ("POST", "/v1/employees/support/limits", {"daily_usd": 1}),
        ]  # fmt: skip
        for method, path, body in admin_only:
            r = await alice.request(method, path, json=body)
            problem_of(r, 403, "forbidden")
        assert (await query(pool, "SELECT name FROM users")) == [{"name": "alice"}]
        await say(alice, "m-1", "hello")
        assert (await admin.delete("/v1/users/alice")).status_code == 204
        r = await alice.post("/v1/employees/support/chat", json={"client_message_id": "m-2",
                                                                  "text": "still here?"})  # fmt: skip
        problem_of(r, 401, "unauthorized")
    problem_of(await admin.delete("/v1/users/alice"), 404, "not-found")
    async with as_user(ingress_url, users.TOKEN_PREFIX + "guessed") as guess:
        problem_of(await guess.get("/v1/employees/support/chat/1"), 401, "unauthorized")


async def test_each_audience_sees_only_its_own_messages(
    started: str, admin: Client, ingress_url: str, pool: AsyncConnectionPool[Conn]
) -> None:
    async with (
        as_user(ingress_url, await add_user(admin, "alice")) as alice,
        as_user(ingress_url, await add_user(admin, "bob")) as bob,
    ):
        # The same session and client id in three audiences are three messages.
        ids = {name: await say(api, "same-id", f"{name} here", session="phone")
               for name, api in [("alice", alice), ("bob", bob), ("owner", admin)]}  # fmt: skip
        assert len(set(ids.values())) == 3
        assert await say(alice, "same-id", "alice here", session="phone") == ids["alice"]
        for name, api in [("alice", alice), ("bob", bob), ("owner", admin)]:
            for other, message_id in ids.items():
                r = await api.get(f"/v1/employees/support/chat/{message_id}")
                if other == name:
                    assert r.json()["status"] == "queued"
                else:
                    problem_of(r, 404, "not-found")
        rows = await query(pool, "SELECT audience, session, text FROM chat_messages ORDER BY id")
        assert [(r["audience"], r["session"]) for r in rows] == [
            ("alice", "phone"), ("bob", "phone"), ("owner", "phone")
        ]  # fmt: skip


async def test_a_users_chat_is_its_own_thread_and_nothing_else_reaches_it(
    started: str, admin: Client, ingress_url: str, pool: AsyncConnectionPool[Conn]
) -> None:
    async with as_user(ingress_url, await add_user(admin, "alice")) as alice:
        await say(alice, "a-1", "from alice")
        await say(alice, "a-2", "from alice's laptop", session="laptop")
    await say(admin, "o-1", "from the admin")
    r = await admin.post("/hooks/internal", content=b'{"x": 1}',
                         headers={"X-Event-Id": uuid.uuid4().hex})  # fmt: skip
    assert r.status_code == 200
    await route_until_done(pool)
    rows = await query(pool, "SELECT thread, route FROM bus_deliveries ORDER BY ingress_id")
    threads = [(r["thread"], r["route"].get("audience"), r["route"].get("session")) for r in rows]
    alice_thread = await user_thread(pool, "alice")
    assert threads[:2] == [(alice_thread, "alice", "owner"), (alice_thread, "alice", "laptop")]
    assert threads[2] == ("main", "owner", "owner")
    (hook,) = rows[3:]
    assert hook["route"]["kind"] == "webhook" and hook["thread"] == "main"
    assert "alice" not in alice_thread

    # Attention raised by alice's turns is hers (and the admin's); the rest the admin's alone.
    (stream,) = await query(pool, "SELECT stream_key FROM bus_streams WHERE thread = %s",
                            alice_thread)  # fmt: skip
    (main,) = await query(pool, "SELECT stream_key FROM bus_streams WHERE thread = 'main' "
                          "AND lane = 'talk'")  # fmt: skip
    async with pool.connection() as conn:
        for key in (stream["stream_key"], main["stream_key"]):
            await turns.dead_letter(conn, DeadLetter("support", key, "turn-x", [1], [0], "boom"))
    items = await query(pool, "SELECT ref, audience FROM attention_items ORDER BY id")
    assert [i["audience"] for i in items] == ["alice", None]
