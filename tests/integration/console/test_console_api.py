"""The console's reads and its static files on the in-process ingress and a real database:
pages and cursors, what a user token may and may not read, and the headers of every answer
under /console."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN, apply_and_start
from psycopg_pool import AsyncConnectionPool
from test_turns import local_spec

from eventos.db import Conn
from eventos.delivery.routing import route_pass


async def call(
    url: str, method: str, path: str, token: str = ADMIN_TOKEN, **kw: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as c:
        return await c.request(method, path, **kw)


async def chat(url: str, name: str, text: str, token: str = ADMIN_TOKEN) -> int:
    doc = {"client_message_id": uuid.uuid4().hex, "text": text}
    r = await call(url, "POST", f"/v1/employees/{name}/chat", token, json=doc)
    assert r.status_code == 202, r.text
    return int(r.json()["message_id"])


async def user(url: str, name: str) -> str:
    r = await call(url, "POST", "/v1/users", json={"name": name})
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


async def test_employee_summaries_page_by_name_with_pending_and_attention(
    started: str, ingress_url: str, pool: AsyncConnectionPool[Conn]
) -> None:
    await apply_and_start(pool, local_spec("alpha", "    - {kind: chat}\n") +
                          "  budget: {daily_usd: 5}\n")  # fmt: skip
    await apply_and_start(pool, local_spec("zulu", "    - {kind: chat}\n"))
    for text in ("one", "two"):
        await chat(ingress_url, "alpha", text)
    async with pool.connection() as conn:
        await route_pass(conn)  # routed, and no relay runs: both wait, class C1
        await conn.execute("INSERT INTO attention_items (employee, kind, severity, ref) "
                           "VALUES ('alpha', 'test_kind', 'warning', 'r1'), "
                           "('alpha', 'test_kind', 'warning', 'r2')")  # fmt: skip
        await conn.commit()

    first = await call(ingress_url, "GET", "/v1/employee-summaries", params={"limit": 2})
    assert first.status_code == 200, first.text
    doc = first.json()
    assert [e["name"] for e in doc["employee_summaries"]] == ["alpha", "support"]
    alpha = doc["employee_summaries"][0]
    assert alpha["state"] == "running" and alpha["generation"] == 1
    assert alpha["pending"] == {"C1": 2} and alpha["pending_capped"] is False
    assert alpha["attention_open"] == 2
    assert alpha["budget"]["daily_usd"] == 5.0 and alpha["budget"]["spent_usd"] == 0
    nxt = await call(ingress_url, "GET", "/v1/employee-summaries",
                     params={"limit": 2, "cursor": doc["next_cursor"]})  # fmt: skip
    rest = nxt.json()
    assert [e["name"] for e in rest["employee_summaries"]] == ["zulu"]
    assert rest["next_cursor"] is None
    assert rest["employee_summaries"][0]["pending"] == {}


@pytest.mark.parametrize(
    ("query", "field"),
    [({"limit": "0"}, "limit"), ({"limit": "201"}, "limit"), ({"limit": "x"}, "limit"),
     ({"cursor": "not-a-cursor"}, "cursor"), ({"cursor": "WzFd"}, "cursor")],
)  # fmt: skip
async def test_a_bad_page_request_is_refused_with_its_field(
    started: str, ingress_url: str, query: dict[str, str], field: str
) -> None:
    r = await call(ingress_url, "GET", "/v1/employee-summaries", params=query)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["errors"][0]["path"] == field


async def test_me_names_the_caller_and_the_employees_it_may_chat_with(
    started: str, ingress_url: str
) -> None:
    r = await call(ingress_url, "GET", "/v1/me")
    assert r.json() == {"name": "owner", "admin": True, "chat": ["support"]}
    token = await user(ingress_url, "carol")
    r = await call(ingress_url, "GET", "/v1/me", token)
    assert r.json() == {"name": "carol", "admin": False, "chat": ["support"]}
    r = await call(ingress_url, "GET", "/v1/me", "eos_u_not-a-token")
    assert r.status_code == 401


async def test_a_user_token_reads_only_its_own_chat_and_none_of_the_admin_pages(
    started: str, ingress_url: str
) -> None:
    dave, erin = await user(ingress_url, "dave"), await user(ingress_url, "erin")
    await chat(ingress_url, started, "dave's own words", dave)
    await chat(ingress_url, started, "the owner's words")
    mine = await call(ingress_url, "GET", f"/v1/employees/{started}/chat", dave)
    assert [m["text"] for m in mine.json()["messages"]] == ["dave's own words"]
    theirs = await call(ingress_url, "GET", f"/v1/employees/{started}/chat", erin)
    assert theirs.json() == {"messages": [], "next_cursor": None, "last_event_id": 0}
    owner = await call(ingress_url, "GET", f"/v1/employees/{started}/chat")
    assert [m["text"] for m in owner.json()["messages"]] == ["the owner's words"]
    for path in ("/v1/employee-summaries", f"/v1/employees/{started}/turns",
                 f"/v1/employees/{started}/conversations"):  # fmt: skip
        refused = await call(ingress_url, "GET", path, dave)
        assert refused.status_code == 403, path


async def test_chat_history_pages_newest_first(started: str, ingress_url: str) -> None:
    for i in range(5):
        await chat(ingress_url, started, f"message {i}")
    path = f"/v1/employees/{started}/chat"
    seen, cursor = [], None
    while True:
        r = await call(ingress_url, "GET", path, params={"limit": 2, "cursor": cursor} if cursor
                       else {"limit": 2})  # fmt: skip
        doc = r.json()
        seen += [m["text"] for m in doc["messages"]]
        cursor = doc["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"message {i}" for i in (4, 3, 2, 1, 0)]
    assert all(m["reply"] is None for m in doc["messages"])


async def test_turns_page_newest_first_with_their_steps_and_cost(
    started: str, ingress_url: str, pool: AsyncConnectionPool[Conn]
) -> None:
    async with pool.connection() as conn:
        for n in (1, 2, 3):
            await conn.execute(
                "INSERT INTO turns (id, employee, generation, agent, thread, n, class, "
                "stream_key, status, started_at) VALUES (%s, %s, 1, 'front', %s, %s, 1, 'k', "
                "'done', now() - make_interval(mins => 10 - %s))",
                (f"turn-{n}", started, "main" if n != 2 else "t_other", n, n),
            )
        await conn.execute(
            "INSERT INTO spend_events (key, employee, period_start, turn_id, class, model, "
            "estimate_usd, actual_usd, input_tokens, output_tokens, state) VALUES "
            "('k1', %(e)s, now(), 'turn-3', 1, 'local/scripted', 0.5, 0.25, 10, 20, 'settled'), "
            "('k2', %(e)s, now(), 'turn-3', 1, 'local/scripted', 0.5, NULL, NULL, NULL, "
            "'reserved')", {"e": started})  # fmt: skip
        await conn.execute(
            "INSERT INTO tool_calls (id, employee, generation, lane, thread, route, turn_id, "
            "name, effect, arguments, status, outcome) VALUES ('c1', %s, 1, 'talk', 'main', "
            "'{}', 'turn-3', 'http_request', 'unsafe', '{\"url\": \"secret\"}', 'done', 'ok')",
            (started,),
        )
        await conn.commit()
    path = f"/v1/employees/{started}/turns"
    first = (await call(ingress_url, "GET", path, params={"limit": 2})).json()
    assert [t["id"] for t in first["turns"]] == ["turn-3", "turn-2"]
    newest = first["turns"][0]
    assert newest["cost_usd"] == 0.75  # settled 0.25, and 0.5 still reserved
    assert (newest["input_tokens"], newest["output_tokens"]) == (10, 20)
    assert [s["kind"] for s in newest["steps"]] == ["llm", "llm", "tool"]
    tool = newest["steps"][2]
    assert tool["name"] == "http_request" and "secret" not in str(tool)  # never the arguments
    rest = (await call(ingress_url, "GET", path, params={"cursor": first["next_cursor"]})).json()
    assert [t["id"] for t in rest["turns"]] == ["turn-1"] and rest["next_cursor"] is None
    one = (await call(ingress_url, "GET", path, params={"thread": "t_other"})).json()
    assert [t["id"] for t in one["turns"]] == ["turn-2"]


async def test_reads_of_an_unknown_employee_are_not_found(started: str, ingress_url: str) -> None:
    for path in ("turns", "conversations", "chat"):
        r = await call(ingress_url, "GET", f"/v1/employees/nobody/{path}")
        assert r.status_code == 404, (path, r.text)


async def test_the_console_page_and_assets_carry_csp_and_cache_headers(ingress_url: str) -> None:
    async with httpx.AsyncClient(base_url=ingress_url, timeout=10) as c:
        page = await c.get("/console", headers={"Accept-Encoding": "identity"})
        assert page.status_code == 200
        assert page.headers["cache-control"] == "no-cache"
        (script,) = re.findall(r'src="(/console/assets/[0-9a-f]{16}/app\.js)"', page.text)
        asset = await c.get(script, headers={"Accept-Encoding": "gzip"})
        assert asset.status_code == 200
        assert asset.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert asset.headers["content-encoding"] == "gzip"
        assert asset.headers["content-type"].startswith("text/javascript")
        assert b"import" in asset.content  # httpx undid the gzip
        stale = await c.get(re.sub(r"/[0-9a-f]{16}/", "/0123456789abcdef/", script))
        missing = await c.get("/console/nothing-here")
        posted = await c.post("/console/", content=b"token=x")
        for answer in (page, asset, stale, missing, posted):
            assert answer.headers["content-security-policy"].startswith("default-src 'none';")
            assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["referrer-policy"] == "no-referrer"
        assert (stale.status_code, missing.status_code, posted.status_code) == (404, 404, 405)
        assert "<script>" not in page.text and "style=" not in page.text  # nothing inline


async def test_counts_say_what_waits_for_the_caller(
    started: str, ingress_url: str, pool: AsyncConnectionPool[Conn]
) -> None:
    frank = await user(ingress_url, "frank")
    before = (await call(ingress_url, "GET", "/v1/counts")).json()
    assert before == {"attention_open": 0, "approvals_pending": 0, "outbox_unknown": 0,
                      "cap": 1000}  # fmt: skip
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO attention_items (employee, kind, severity, ref, audience, state) VALUES "
            "(%(e)s, 'test_kind', 'warning', 'c1', NULL, 'open'), "
            "(%(e)s, 'test_kind', 'warning', 'c2', 'frank', 'open'), "
            "(%(e)s, 'test_kind', 'warning', 'c3', 'frank', 'acked'), "
            "(%(e)s, 'test_kind', 'warning', 'c4', NULL, 'resolved')",
            {"e": started},
        )
        await conn.commit()
    admin = (await call(ingress_url, "GET", "/v1/counts")).json()
    assert admin["attention_open"] == 2  # open only: an acknowledged item was seen
    mine = (await call(ingress_url, "GET", "/v1/counts", frank)).json()
    assert mine == {"attention_open": 1, "approvals_pending": 0, "outbox_unknown": None,
                    "cap": 1000}  # fmt: skip
    assert (await call(ingress_url, "GET", "/v1/counts", "eos_u_not-a-token")).status_code == 401
