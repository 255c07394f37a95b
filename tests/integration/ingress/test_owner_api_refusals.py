"""Apply refuses what cannot run, by field path, before anything is stored; a chat to an
employee that takes none is 409 (issue 26 point 2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN, apply_and_start
from psycopg_pool import AsyncConnectionPool
from test_owner_api_edges import problem_of

from eventos.db import Conn

SPEC = """apiVersion: eventos/v1
kind: Employee
metadata: {name: nightly}
spec:
  timezone: Europe/Paris
  agents: [{name: front, model: {provider: local, name: scripted}}]
  triggers:
    - {kind: chat}
    - {kind: cron, name: report, schedule: "0 3 * * *"}
    - {kind: grpc, driver: drv-n, thread_by: subject, types: [invoice.*]}
"""
GOOD_CRON = 'schedule: "0 3 * * *"'
# (change, field path, words of the message): each once, on an otherwise valid spec.
REFUSALS = [
    ((GOOD_CRON, 'schedule: "61 * * * *"'), "spec.triggers[1].schedule", "Bad minute"),
    ((GOOD_CRON, 'schedule: "0 3 L * *"'), "spec.triggers[1].schedule", "no L, W, ? or #"),
    ((GOOD_CRON, 'schedule: "0 0 3 * * *"'), "spec.triggers[1].schedule", "5 fields"),
    ((GOOD_CRON, 'schedule: "@every 5s"'), "spec.triggers[1].schedule", "at least a minute"),
    (("Europe/Paris", "localtime"), "spec.timezone", "unknown time zone"),
    (("thread_by: subject", "thread_by: data..id"), "spec.triggers[2].thread_by", "dotted"),
    (("types: [invoice.*]", "types: ['inv*ice']"), "spec.triggers[2].types", "prefix.*"),
    (("{kind: chat}", "{kind: chat, filter: {data.kind: {a: 1}}}"), "spec.triggers[0].filter",
     "a list of values"),
    (("name: report,", "name: report, interval_s: 60,"), "spec.triggers[1]",
     "by a poll trigger only"),
    (("{kind: chat}", "{kind: chat, schedule: '0 3 * * *'}"), "spec.triggers[0]",
     "by a cron trigger only"),
]  # fmt: skip


@pytest.fixture
async def api(ingress_url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=20) as c:
        yield c


async def apply(api: httpx.AsyncClient, text: str) -> httpx.Response:
    return await api.post("/v1/employees", content=text,
                          headers={"content-type": "application/yaml"})  # fmt: skip


async def count(pool: AsyncConnectionPool[Conn], query: str, *args: Any) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute(query, args)
        return int((await cur.fetchone() or {})["n"])


@pytest.mark.parametrize(("change", "path", "words"), REFUSALS)
async def test_apply_refuses_what_cannot_run_by_field_path_and_stores_nothing(
    api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn], change: tuple[str, str], path: str,
    words: str,
) -> None:  # fmt: skip
    r = await apply(api, SPEC.replace(*change))
    errors = problem_of(r, 400, "invalid-spec")["errors"]
    assert [e["path"] for e in errors] == [path], errors  # type: ignore[union-attr]
    assert words in errors[0]["message"], errors  # type: ignore[index]
    problem_of(await api.get("/v1/employees/nightly"), 404, "not-found")
    assert await count(pool, "SELECT count(*) AS n FROM employees") == 0
    # The same spec, runnable, is taken.
    assert (await apply(api, SPEC)).status_code == 200


async def test_a_duplicate_key_is_refused_naming_the_body_line_and_column(
    api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    twice = SPEC.replace("  timezone: Europe/Paris\n",
                         "  timezone: Europe/Paris\n  timezone: UTC\n")  # fmt: skip
    errors = problem_of(await apply(api, twice), 400, "invalid-spec")["errors"]
    assert errors == [{"path": "(yaml)", "message": "request body:6:3: "
                       "duplicate key 'timezone' (first at line 5)"}]  # fmt: skip
    errors = problem_of(await apply(api, "kind: [unclosed\n"), 400, "invalid-spec")["errors"]
    assert errors[0]["message"].startswith("request body:2:1: ")  # type: ignore[index]
    assert await count(pool, "SELECT count(*) AS n FROM employees") == 0


async def test_chat_to_an_employee_without_a_chat_trigger_is_409_and_stores_nothing(
    api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    no_chat = SPEC.replace("    - {kind: chat}\n", "")
    await apply_and_start(pool, no_chat)
    user = await api.post("/v1/users", json={"name": "guest"})
    assert user.status_code == 201, user.text
    as_user = {"Authorization": f"Bearer {user.json()['token']}"}
    me = (await api.get("/v1/me", headers=as_user)).json()
    assert "nightly" not in str(me)  # `/v1/me` lists no chat with it either
    for headers in ({}, as_user):
        r = await api.post("/v1/employees/nightly/chat", headers=headers,
                           json={"client_message_id": "m-1", "text": "hello?"})  # fmt: skip
        doc = problem_of(r, 409, "conflict")
        assert "no chat trigger" in str(doc["detail"])
    assert await count(pool, "SELECT count(*) AS n FROM chat_messages") == 0
    assert await count(pool, "SELECT count(*) AS n FROM bus_ingress") == 0
