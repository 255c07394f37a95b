"""Deleting an employee (`DELETE /v1/employees/{name}`, `eventosctl delete`), on the real dev
server and PostgreSQL with the ingress, router, relay and intent deliverer running."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN
from temporalio.client import WorkflowExecutionStatus
from test_router import query
from test_supervision import applied, post
from test_turns import (  # noqa: F401 (`instance` is a fixture)
    Instance,
    instance,
    local_spec,
)

from eventos import names
from eventos.cli import main
from eventos.db.sql import Q
from eventos.employees import lifecycle
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal

PROBLEM = "application/problem+json"


@pytest.fixture(autouse=True)
def no_ambient_instance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EVENTOS_URL", "EVENTOS_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def hooked(path: str) -> Any:
    """Owner chat and an unverified webhook on `path` (deduped by a header)."""

    def spec(name: str) -> str:
        return local_spec(name, f"""    - {{kind: chat}}
    - {{kind: webhook, path: {path}, verify: {{scheme: none}}, dedupe_header: X-Event-Id}}
""")  # fmt: skip

    return spec


async def ctl(instance: Instance, *argv: str) -> int:
    """eventosctl in a thread: the ingress under test serves on this test's event loop."""
    url = str(instance.api.base_url).rstrip("/")
    return await asyncio.to_thread(main, [*argv, "--url", url, "--token", ADMIN_TOKEN])


async def hook(instance: Instance, path: str) -> int:
    r = await instance.api.post(f"/hooks/{path}", content=b'{"n": 1}',
                                headers={"X-Event-Id": uuid.uuid4().hex})  # fmt: skip
    return r.status_code


async def names_listed(instance: Instance) -> dict[str, set[str]]:
    """The employee names each list shows: the API's, the console's and `/v1/me`'s."""
    api = (await instance.api.get("/v1/employees")).json()["employees"]
    console = (await instance.api.get("/v1/employee-summaries", params={"limit": "200"})).json()
    me = (await instance.api.get("/v1/me")).json()
    return {"api": {r["name"] for r in api},
            "console": {r["name"] for r in console["employee_summaries"]},
            "me": set(me["chat"])}  # fmt: skip


async def timeline_ids(instance: Instance, name: str) -> set[int]:
    """The ids of the employee's timeline entries (its newest 200)."""
    r = await instance.api.get(f"/v1/employees/{name}/timeline", params={"limit": "200"})
    assert r.status_code == 200, r.text
    return {int(e["id"]) for e in r.json()["timeline"]}


def problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    return dict(r.json())


async def test_delete_refuses_a_running_employee_then_frees_its_name_and_path_and_keeps_history(
    instance: Instance, capsys: pytest.CaptureFixture[str]
) -> None:
    path = f"p-{uuid.uuid4().hex[:8]}"
    name = f"d{uuid.uuid4().hex[:8]}"
    await post(instance, "/v1/employees", status=200, content=hooked(path)(name))
    await applied(instance, name, "start")
    r = await instance.api.post(f"/v1/employees/{name}/chat",
                                json={"client_message_id": "m1", "text": "remember me"})  # fmt: skip
    first = r.json()["message_id"]
    assert "remember me" in await instance.reply(first, name=name)
    assert await hook(instance, path) == 200

    # A user token may not delete (403), the admin may not while it runs (409): nothing changes.
    user = await post(instance, "/v1/users", status=201, json={"name": f"u{name}"})
    as_user = {"Authorization": f"Bearer {user['token']}"}
    problem(await instance.api.delete(f"/v1/employees/{name}", headers=as_user), 403)
    refused = problem(await instance.api.delete(f"/v1/employees/{name}"), 409)
    assert f"eventosctl stop {name}" in refused["detail"] and "running" in refused["detail"]
    assert await ctl(instance, "delete", name) != 0
    assert f"eventosctl stop {name}" in capsys.readouterr().err
    assert (await instance.api.get(f"/v1/employees/{name}")).json()["state"] == "running"
    assert all(name in listed for listed in (await names_listed(instance)).values())
    assert await hook(instance, path) == 200
    other = f"o{uuid.uuid4().hex[:8]}"
    clash = await instance.api.post("/v1/employees", content=hooked(path)(other))
    assert problem(clash, 409)["detail"].startswith(f"webhook path {path!r} is already used")

    # The first hook's turn has run (the history kept below counts it): only then the stop.
    async def hook_turn_done() -> bool:
        q = "SELECT count(*) AS n FROM turns WHERE employee = %s AND status = %s"
        return (await query(instance.pool, q, name, names.TURN_DONE))[0]["n"] >= 2

    await wait_for(hook_turn_done, timeout=60, what="the chat's and the first hook's turns done")

    # Stop, then delete: the paused generation retires through a Reset intent.
    await applied(instance, name, "stop")
    history = await timeline_ids(instance, name)
    assert len(history) > 5
    async with instance.pool.connection() as conn:  # as its failing turns would make it
        await conn.execute(Q["employee_degrade"], {"employee": name, "now": datetime.now(UTC),
                                                   "reason": "turns keep failing"})  # fmt: skip
    assert (await instance.api.get(f"/v1/employees/{name}")).json()["degraded"] is not None
    assert await ctl(instance, "delete", name, "--wait") == 0
    out = capsys.readouterr().out
    assert f"employee/{name} deleted (generation 1 retired" in out and "applied" in out
    supervisor = instance.client.get_workflow_handle(names.supervisor_id(name, 1))
    assert (await supervisor.describe()).status == WorkflowExecutionStatus.COMPLETED
    assert all(name not in listed for listed in (await names_listed(instance)).values())
    assert await ctl(instance, "list") == 0
    assert name not in capsys.readouterr().out
    problem(await instance.api.get(f"/v1/employees/{name}"), 404)
    problem(await instance.api.post(f"/v1/employees/{name}:start"), 404)
    problem(await instance.api.post(f"/v1/employees/{name}/chat",
                                    json={"client_message_id": "m2", "text": "x"}), 404)  # fmt: skip
    problem(await instance.api.delete(f"/v1/employees/{name}"), 404)  # once only

    # No source is held any more: channel readers and routing follow live subscriptions only.
    held = await query(instance.pool, """SELECT s.source_key FROM bus_subscriptions s
        JOIN generations g USING (employee, generation)
        WHERE s.employee = %s AND g.state <> 'retired'""", name)  # fmt: skip
    assert held == []

    # Its hook path is free: nobody serves it, and another employee may claim and serve it.
    async def unserved() -> bool:  # within the ingress route table's refresh (routes.py)
        return await hook(instance, path) == 404

    await wait_for(unserved, timeout=10, interval=0.2, what="the deleted employee's path gone")
    assert (await post(instance, "/v1/employees", status=200,
                       content=hooked(path)(other)))["applied"][0]["created"]  # fmt: skip
    await applied(instance, other, "start")
    assert await hook(instance, path) == 200

    async def other_consumed() -> bool:
        q = """SELECT d.status FROM bus_deliveries d JOIN bus_streams s USING (stream_key)
               WHERE s.employee = %s AND d.type = %s"""
        rows = await query(instance.pool, q, other, names.TYPE_WEBHOOK)
        return [r["status"] for r in rows] == ["done"]

    await wait_for(other_consumed, timeout=30, what="the other employee consumed the hook")

    # Its history stays: the timeline by its name, its turns, transcript and messages.
    assert await timeline_ids(instance, name) >= history
    kept = await query(instance.pool, """SELECT
        (SELECT count(*) FROM turns WHERE employee = %s AND generation = 1) AS turns,
        (SELECT count(*) FROM chat_messages WHERE employee = %s) AS messages,
        (SELECT count(*) FROM transcript_messages WHERE employee = %s) AS transcript""",
        name, name, name)  # fmt: skip
    assert kept[0]["turns"] >= 2 and kept[0]["messages"] == 1  # the chat's and the hook's
    assert kept[0]["transcript"] >= 4  # each turn's question and answer

    # The name applied again is a fresh employee: its first Start is generation 2.
    again = await post(instance, "/v1/employees", status=200, content=hooked(f"{path}-2")(name))
    assert again["applied"] == [{"name": name, "created": True, "changed": True}]
    fresh = (await instance.api.get(f"/v1/employees/{name}")).json()
    assert (fresh["state"], fresh["generation"], fresh["degraded"]) == ("stopped", None, None)
    assert (await applied(instance, name, "start"))["state"] == names.INTENT_APPLIED
    assert (await instance.api.get(f"/v1/employees/{name}")).json()["generation"] == 2
    r = await instance.api.post(f"/v1/employees/{name}/chat",
                                json={"client_message_id": "m3", "text": "hello again"})  # fmt: skip
    assert "hello again" in await instance.reply(r.json()["message_id"], name=name)
    assert await timeline_ids(instance, name) > history  # the old generation's entries too


async def test_delete_of_an_employee_never_started_and_of_an_unknown_one(
    instance: Instance,
) -> None:
    name = f"n{uuid.uuid4().hex[:8]}"
    path = f"p-{uuid.uuid4().hex[:8]}"
    await post(instance, "/v1/employees", status=200, content=hooked(path)(name))
    r = await instance.api.delete(f"/v1/employees/{name}")
    assert r.status_code == 200, r.text
    assert (r.json()["retired_generation"], r.json()["intent"]) == (None, None)
    problem(await instance.api.get(f"/v1/employees/{name}"), 404)
    problem(await instance.api.delete(f"/v1/employees/never-{name}"), 404)
    # Starting is live too (a Start committed without its intent: it stays `starting`).
    other = f"s{uuid.uuid4().hex[:8]}"
    await post(instance, "/v1/employees", status=200, content=hooked(path)(other))
    async with instance.pool.connection() as conn:
        await lifecycle.start(conn, other)
    detail = problem(await instance.api.delete(f"/v1/employees/{other}"), 409)["detail"]
    assert "is starting: stop it first" in detail
    assert (await instance.api.get(f"/v1/employees/{other}")).json()["state"] == "starting"
