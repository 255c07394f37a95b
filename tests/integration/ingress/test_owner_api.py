"""The owner API: apply with field-path errors, path uniqueness, lifecycle, owner chat."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN, SPEC
from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn
from eventos.testing import wait_for

HELLO = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: hello}
spec:
  agents: [{name: front, model: {provider: local, name: scripted}}]
  triggers:
    - {kind: chat}
    - {kind: webhook, path: hello, verify: {scheme: none}, dedupe_header: X-Event-Id}
"""


@pytest.fixture
async def api(ingress_url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=10) as c:
        yield c


async def apply(api: httpx.AsyncClient, text: str) -> httpx.Response:
    return await api.post(
        "/v1/employees", content=text, headers={"content-type": "application/yaml"}
    )


async def test_apply_start_stop_resume_reset(api: httpx.AsyncClient) -> None:
    r = await apply(api, HELLO)
    assert r.status_code == 200
    assert r.json()["applied"] == [{"name": "hello", "created": True, "changed": True}]
    again = await apply(api, HELLO)
    assert again.json()["applied"] == [{"name": "hello", "created": False, "changed": False}]
    assert (await api.get("/v1/employees/hello")).json()["state"] == "stopped"
    # Each change commits at once with an intent (no deliverer runs here: they stay applying);
    # the control revision counts per generation.
    steps = [("start", "starting", 1, 1), ("stop", "paused", 1, 2), ("resume", "running", 1, 3),
             ("reset", "retired", 1, 4), ("start", "starting", 2, 1)]  # fmt: skip
    for action, state, generation, revision in steps:
        r = await api.post(f"/v1/employees/hello:{action}")
        assert r.status_code == 202, r.text
        assert (r.json()["state"], r.json()["generation"]) == (state, generation)
        intent = r.json()["intent"]
        assert (intent["kind"], intent["state"], intent["revision"]) == (
            action,
            "applying",
            revision,
        )
        assert (await api.get(f"/v1/intents/{intent['id']}")).json() == intent
    listed = (await api.get("/v1/employees")).json()["employees"]
    assert [(e["name"], e["state"], e["generation"], e["intent"]["kind"]) for e in listed] == [
        ("hello", "starting", 2, "start")
    ]
    assert (await api.get("/v1/intents/999")).status_code == 404


async def test_limits_and_interrupt_write_intents(api: httpx.AsyncClient) -> None:
    await apply(api, HELLO)
    assert (await api.post("/v1/employees/hello/limits", json={"daily_usd": 5})).status_code == 409
    assert (await api.post("/v1/employees/hello:start")).status_code == 202
    for bad in ({"daily_usd": -1}, {"daily_usd": "5"}, {"weekly_usd": 5}, {}):
        r = await api.post("/v1/employees/hello/limits", json=bad)
        assert r.status_code == 400, bad
    r = await api.post("/v1/employees/hello/limits", json={"daily_usd": 12.5})
    assert r.status_code == 202
    assert (r.json()["intent"]["kind"], r.json()["intent"]["revision"]) == ("limits", 2)
    got = (await api.get("/v1/employees/hello")).json()
    assert (got["limits"], got["revision"]) == ({"daily_usd": 12.5}, 2)
    # Interrupt names a conversation that exists; the owner's chat has none before a message.
    r = await api.post("/v1/employees/hello:interrupt", json={"conversation": "talk/main"})
    assert r.status_code == 404
    assert "no conversation" in r.json()["detail"]
    r = await api.post("/v1/employees/hello:interrupt", json={"conversation": "nonsense"})
    assert r.status_code == 400
    r = await api.post("/v1/rearm")
    assert (r.status_code, r.json()["kind"], r.json()["state"]) == (202, "rearm", "applying")


async def test_lifecycle_refusals(api: httpx.AsyncClient) -> None:
    assert (await api.post("/v1/employees/nobody:start")).status_code == 404
    await apply(api, HELLO)
    assert (await api.post("/v1/employees/hello:resume")).status_code == 409
    assert (await api.post("/v1/employees/hello:start")).status_code == 202
    assert (await api.post("/v1/employees/hello:start")).status_code == 409
    assert (await api.post("/v1/employees/hello:explode")).status_code == 404


async def test_bad_spec_names_each_field_path(api: httpx.AsyncClient) -> None:
    bad = HELLO.replace("provider: local", "provider: nope").replace(
        "scheme: none}, dedupe_header: X-Event-Id", "scheme: stripe, secret: whsec_live_abc}"
    )
    r = await apply(api, bad)
    assert r.status_code == 400
    paths = {e["path"]: e["message"] for e in r.json()["errors"]}
    assert "spec.agents[0].model.provider" in paths
    assert "secret reference" in paths["spec.triggers[1].verify.secret"]
    r = await apply(api, "kind: [unclosed")
    assert r.status_code == 400
    r = await api.post("/v1/employees", json={"apiVersion": "eventos/v1", "kind": "Employee"})
    assert r.status_code == 400
    assert {e["path"] for e in r.json()["errors"]} == {"metadata", "spec"}


async def test_apply_refuses_an_unknown_tool_and_takes_every_channel(
    api: httpx.AsyncClient,
) -> None:
    tool = HELLO.replace("name: scripted}}", "name: scripted}, tools: [set_alarm, teleport]}")
    r = await apply(api, tool)
    assert r.status_code == 400, r.text
    (error,) = r.json()["errors"]
    assert error["path"] == "spec.agents[0].tools[1]"
    assert error["message"].startswith("unknown tool 'teleport'; known tools: ")
    approval = HELLO.replace("  triggers:", "  approvals: {tools: [teleport]}\n  triggers:")
    r = await apply(api, approval)
    assert r.status_code == 400, r.text
    assert r.json()["errors"] == [{"path": "spec.approvals.tools[0]",
                                   "message": "unknown tool 'teleport'"}]  # fmt: skip
    assert (await api.get("/v1/employees/hello")).status_code == 404  # nothing was applied
    channel = HELLO.replace(
        "    - {kind: chat}\n", "    - {kind: chat}\n    - {kind: telegram, account: tg}\n"
    )
    r = await apply(api, channel)  # every channel kind has its driver
    assert r.status_code == 200, r.text


async def test_webhook_paths_are_unique_per_instance(api: httpx.AsyncClient) -> None:
    assert (await apply(api, HELLO)).status_code == 200
    clash = HELLO.replace("name: hello}", "name: other}")
    r = await apply(api, clash)
    assert r.status_code == 409
    assert "hello" in r.json()["detail"]
    # The owner may move the path: once `hello` drops it, `other` can take it...
    assert (await api.post("/v1/employees/hello:start")).status_code == 202
    assert (await apply(api, HELLO.replace("path: hello", "path: hello-2"))).status_code == 200
    # ...but not while hello's running generation still routes it.
    assert (await apply(api, clash)).status_code == 409
    assert (await api.post("/v1/employees/hello:reset")).status_code == 202
    assert (await apply(api, clash)).status_code == 200


async def chat(
    api: httpx.AsyncClient, cid: str, text: str = "hi", name: str = "support"
) -> httpx.Response:
    return await api.post(
        f"/v1/employees/{name}/chat", json={"client_message_id": cid, "text": text}
    )


async def chat_rows(pool: AsyncConnectionPool[Conn]) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT c.*, i.source_key, i.class, i.status AS ingress_status FROM chat_messages c "
            "JOIN bus_ingress i ON i.id = c.ingress_id ORDER BY c.id"
        )
        return await cur.fetchall()


async def test_chat_is_queued_with_its_ingress_row(
    started: str, api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    r = await chat(api, "m-1", "hello there")
    assert r.status_code == 202
    assert r.json()["status"] == "queued"
    dup = await chat(api, "m-1", "hello there")
    assert dup.status_code == 202
    assert dup.json() == {
        "message_id": r.json()["message_id"],
        "status": "queued",
        "duplicate": True,
    }
    (row,) = await chat_rows(pool)
    assert (row["text"], row["source_key"], row["class"]) == ("hello there", "chat:support", 1)


async def test_chat_bad_input(started: str, api: httpx.AsyncClient) -> None:
    assert (await chat(api, "", "x")).status_code == 400
    assert (await chat(api, "m", "   ")).status_code == 400
    assert (await chat(api, "m", "x" * 40000)).status_code == 400
    assert (await chat(api, "m", "x", name="nobody")).status_code == 404
    r = await api.post("/v1/employees/support/chat", content=b"not json")
    assert r.status_code == 400
    r = await api.post(
        "/v1/employees/support/chat", json={"client_message_id": "m", "text": "x", "session": ""}
    )
    assert r.status_code == 400
    r = await api.post("/v1/employees/support/chat", json={"client_message_id": 7, "text": "x"})
    assert r.status_code == 400


async def test_chat_over_100_pending_is_queue_full_and_saves_nothing(
    started: str, api: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    # Eight at a time: one session's sends serialize on its lock, each holding a connection, so
    # a hundred at once would wait past the pool's 5 s on a loaded machine (503, by design).
    gate = asyncio.Semaphore(8)

    async def send(i: int) -> httpx.Response:
        async with gate:
            return await chat(api, f"m-{i}")

    answers = await asyncio.gather(*(send(i) for i in range(100)))
    assert {a.status_code for a in answers} == {202}
    full = await chat(api, "m-100")
    assert full.status_code == 429
    assert "queue_full" in full.json()["detail"]
    rows = await chat_rows(pool)
    assert len(rows) == 100
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM bus_ingress WHERE source_key = 'chat:support'"
        )
        assert (await cur.fetchone() or {})["n"] == 100


async def test_chat_to_a_stopped_employee_is_refused(api: httpx.AsyncClient) -> None:
    await apply(api, SPEC)
    r = await chat(api, "m-1")
    assert r.status_code == 409


async def test_a_path_answers_right_after_start_and_goes_away_after_reset(
    api: httpx.AsyncClient,
) -> None:
    await apply(api, HELLO)

    async def post() -> int:
        r = await api.post("/hooks/hello", content=b"{}", headers={"X-Event-Id": uuid.uuid4().hex})
        return r.status_code

    assert await post() == 404
    assert (await api.post("/v1/employees/hello:start")).status_code == 202
    assert await post() == 200  # no waiting for the route table's next refresh
    assert (await api.post("/v1/employees/hello:reset")).status_code == 202

    async def gone() -> bool:
        return await post() == 404

    await wait_for(gone, timeout=5, interval=0.2, what="path gone after reset")
