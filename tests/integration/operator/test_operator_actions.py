"""Attention actions and replay on the real stack: the router, relay and intent deliverer, the
workers on the dev server, the ingress over HTTP, a fake OpenAI provider over real HTTP.

Each action is taken for real and its effect seen where a user sees it: a dead input replayed
from its item by the user whose chat it was gets its reply; a parked turn resumed goes on; a
lost supervisor's generation is reset; a webhook whose filter raised, replayed once the filter
is fixed, is consumed by a turn; a chat message killed by a reset, replayed with the CLI, gets
its reply from the next generation.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import pytest
from conftest import ADMIN_TOKEN
from fake_openai import KEY, Answer, FakeOpenAI
from test_budget import budgeted, chat, set_spent
from test_parking import fake, llm_endpoints, on  # noqa: F401 (fixtures)
from test_router import query
from test_supervision import applied, new_employee, post, settled
from test_turns import Instance, instance, local_spec  # noqa: F401 (`instance` is a fixture)

from eventos import names
from eventos.cli import main
from eventos.scheduling import ledger
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal


def keyed(instance: Instance, name: str) -> None:
    """The employee's provider key is configured (a mounted Secret)."""
    cast(dict[str, str], instance.llm.secrets.env)[f"EVENTOS_SECRET_KEY_{name.upper()}"] = KEY


async def item_of(api: httpx.AsyncClient, kind: str, employee: str) -> dict[str, Any]:
    """The employee's newest item of this kind, once raised."""

    async def raised() -> dict[str, Any] | None:
        r = await api.get("/v1/attention", params={"kind": kind, "employee": employee})
        assert r.status_code == 200, r.text
        found = r.json()["attention"]
        return found[0] if found else None

    return await wait_for(raised, timeout=60, interval=0.2, what=f"a {kind} item")


async def act(api: httpx.AsyncClient, item: dict[str, Any], action: str,
              status: int = 202) -> dict[str, Any]:  # fmt: skip
    r = await api.post(f"/v1/attention/{item['id']}:act", json={"action": action})
    assert r.status_code == status, r.text
    return dict(r.json())


async def reply_to(api: httpx.AsyncClient, name: str, message: int) -> str:
    async def answered() -> str | None:
        r = await api.get(f"/v1/employees/{name}/chat/{message}")
        return r.json()["reply"]  # type: ignore[no-any-return]

    return await wait_for(answered, timeout=60, interval=0.2, what=f"the reply to {message}")


@pytest.fixture
async def ann(instance: Instance, ingress_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A user's client."""
    token = (await post(instance, "/v1/users", status=201, json={"name": "ann"}))["token"]
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=10) as c:
        yield c


async def test_a_dead_input_replayed_from_its_item_by_its_user_gets_its_reply(
    instance: Instance, fake: FakeOpenAI, ann: httpx.AsyncClient, ingress_url: str
) -> None:
    name = await new_employee(instance, on(fake))
    keyed(instance, name)
    await applied(instance, name, "start")
    fake.queue(Answer(status=400), Answer(status=400))  # the turn, and its one retry
    body = {"client_message_id": uuid.uuid4().hex, "text": "hello"}
    message = int((await ann.post(f"/v1/employees/{name}/chat", json=body)).json()["message_id"])
    item = await item_of(ann, names.ATTENTION_DEAD_INPUT, name)
    assert (item["audience"], item["actions"]) == ("ann", ["replay"])
    status = (await ann.get(f"/v1/employees/{name}/chat/{message}")).json()["status"]
    assert status == "dead"
    async with httpx.AsyncClient(base_url=ingress_url, timeout=10) as bob_api:
        bob = (await post(instance, "/v1/users", status=201, json={"name": "bob"}))["token"]
        bob_api.headers["Authorization"] = f"Bearer {bob}"
        await act(bob_api, item, "replay", status=404)  # another audience's: not found

    done = await act(ann, item, "replay")
    assert done["replayed"] == 1 and done["replays"][0]["id"].startswith("delivery-")
    assert await reply_to(ann, name, message) == "Hello from the fake."
    await act(ann, item, "replay", status=409)  # resolved by its action: nothing twice
    (letter,) = (await instance.api.get("/v1/dead-letters", params={"employee": name})).json()[
        "dead_letters"
    ]
    assert (letter["id"], letter["replayed_as"]) == (done["replays"][0]["id"],
                                                     done["replays"][0]["as"])  # fmt: skip
    wider = await post(instance, "/v1/replay", status=200, json={"selector": {"employee": name}})
    assert (wider["count"], wider["already_replayed"]) == (0, 1)


async def test_resume_from_a_parked_turns_item_lets_the_same_turn_go_on(
    instance: Instance, fake: FakeOpenAI
) -> None:
    name = await new_employee(instance, on(fake))
    await applied(instance, name, "start")
    message = await chat(instance, name, "hello")  # no key yet: the turn parks
    item = await item_of(instance.api, names.ATTENTION_PARKED_TURN, name)
    assert item["actions"] == ["resume"]
    keyed(instance, name)
    done = await act(instance.api, item, "resume")
    intent = await settled(instance, done["intent"])
    assert (intent["kind"], intent["state"]) == ("resume", "applied")
    assert await instance.reply(message, timeout=60, name=name) == "Hello from the fake."
    turns = await query(instance.pool, "SELECT id, status FROM turns WHERE employee = %s", name)
    assert turns == [{"id": item["ref"], "status": "done"}]  # the parked turn itself went on
    after = (await instance.api.get(f"/v1/attention/{item['id']}")).json()
    assert (after["state"], after["actions"]) == ("resolved", [])  # its cause went away


async def test_resume_with_a_higher_limit_from_a_full_budgets_item_runs_the_held_turn(
    instance: Instance,
) -> None:
    name = await new_employee(instance, budgeted)
    await applied(instance, name, "start")
    async with instance.pool.connection() as conn:
        await ledger.refresh(conn, name)  # the budget's row and the period's spend row
    await set_spent(instance.pool, name, "0.995")
    message = await chat(instance, name, "over budget")  # its step would pass 100%: paused
    item = await item_of(instance.api, names.ATTENTION_BUDGET_MAX, name)
    assert item["actions"] == ["resume"]
    r = await instance.api.post(f"/v1/attention/{item['id']}:act",
                                json={"action": "resume", "daily_usd": -1})  # fmt: skip
    assert r.status_code == 400 and r.json()["errors"][0]["path"] == "daily_usd"
    r = await instance.api.post(f"/v1/attention/{item['id']}:act",
                                json={"action": "resume", "daily_usd": 5})  # fmt: skip
    assert r.status_code == 202, r.text
    intent = await settled(instance, r.json()["intent"])
    assert (intent["kind"], intent["state"]) == ("limits", "applied")
    assert "over budget" in await instance.reply(message, timeout=60, name=name)
    gens = await query(instance.pool, "SELECT state FROM generations WHERE employee = %s", name)
    assert gens == [{"state": names.GEN_RUNNING}]

    async def resolved() -> bool:
        got = (await instance.api.get(f"/v1/attention/{item['id']}")).json()
        return bool(got["state"] == "resolved")

    await wait_for(resolved, timeout=30, what="the budget_max item resolved by its cause")


async def test_reset_from_a_lost_supervisors_item_retires_its_generation(
    instance: Instance,
) -> None:
    name = await new_employee(instance)
    await applied(instance, name, "start")
    async with instance.pool.connection() as conn:  # lost three times within the hour
        for _ in range(names.SUPERVISOR_REBUILDS_PER_HOUR):
            await conn.execute("INSERT INTO supervisor_rebuilds (employee, generation) "
                               "VALUES (%s, 1)", (name,))  # fmt: skip
    await instance.client.get_workflow_handle(names.supervisor_id(name, 1)).terminate("lost")
    answer = await post(instance, f"/v1/employees/{name}/limits", json={"daily_usd": 2})
    assert (await settled(instance, answer["intent"]))["state"] == names.INTENT_FAILED
    item = await item_of(instance.api, names.ATTENTION_SUPERVISOR_LOST, name)
    assert (item["ref"], item["actions"]) == (names.supervisor_id(name, 1), ["reset"])
    done = await act(instance.api, item, "reset")
    intent = await settled(instance, done["intent"])
    assert intent["state"] == names.INTENT_APPLIED and "without a supervisor" in intent["outcome"]
    gens = await query(instance.pool, "SELECT state FROM generations WHERE employee = %s", name)
    assert gens == [{"state": names.GEN_RETIRED}]
    after = (await instance.api.get(f"/v1/attention/{item['id']}")).json()
    assert (after["state"], after["resolved_by"]) == ("resolved", "owner")
    await act(instance.api, item, "reset", status=409)


def hooked(path: str, flt: str) -> Any:
    def spec(name: str) -> str:
        return local_spec(name, f"    - {{kind: webhook, path: {path}, verify: {{scheme: none}}, "
                                f"dedupe_header: X-Event-Id, filter: {{{flt}}}}}\n")  # fmt: skip

    return spec


async def test_a_webhook_whose_filter_raised_is_replayed_after_the_fix_and_consumed(
    instance: Instance,
) -> None:
    path = f"orders-{uuid.uuid4().hex[:8]}"
    name = await new_employee(instance, hooked(path, "data.body.x.y: 1"))
    await applied(instance, name, "start")
    r = await instance.api.post(f"/hooks/{path}", json={"x": "flat"},
                                headers={"X-Event-Id": uuid.uuid4().hex})  # fmt: skip
    assert r.status_code == 200, r.text

    async def dead() -> list[Any] | None:
        got = await instance.api.get("/v1/dead-letters", params={"source": f"webhook:{path}"})
        return got.json()["dead_letters"] or None

    (letter,) = await wait_for(dead, timeout=30, what="the webhook dead-lettered")
    assert letter["reason"] == "filter_error"
    # The owner fixes the filter; the next generation takes it.
    fixed = hooked(path, "data.body.x: flat")(name)
    await post(instance, "/v1/employees", status=200, content=fixed)
    await applied(instance, name, "reset")
    await applied(instance, name, "start")
    selector = {"source": f"webhook:{path}", "reason": "filter_error"}
    seen = await post(instance, "/v1/replay", status=200, json={"selector": selector})
    assert seen["count"] == 1
    done = await post(instance, "/v1/replay", json={"selector": selector,
                                                    "confirmation": seen["confirmation"]})  # fmt: skip
    new_row = done["replays"][0]["as"]

    async def consumed() -> list[dict[str, Any]] | None:
        q = ("SELECT d.status, d.stream_key, t.status AS turn FROM bus_deliveries d "
             "JOIN turns t ON t.stream_key = d.stream_key AND t.consumed_seq >= d.seq "
             "WHERE d.ingress_id = %s")  # fmt: skip
        rows = await query(instance.pool, q, new_row)
        return rows if rows and rows[0]["status"] == "done" else None

    (row,) = await wait_for(consumed, timeout=60, what="the replayed webhook consumed")
    assert row["stream_key"].startswith(f"{name}/g2/") and row["turn"] == "done"


async def test_a_chat_message_killed_by_a_reset_is_replayed_with_the_cli_and_answered(
    instance: Instance, ingress_url: str
) -> None:
    name = await new_employee(instance, lambda n: local_spec(n, "    - {kind: chat}\n"))
    await applied(instance, name, "start")
    await applied(instance, name, "stop")
    message = await chat(instance, name, "are you there?")

    async def held() -> bool:
        q = "SELECT 1 FROM bus_deliveries d JOIN bus_streams s USING (stream_key) WHERE s.employee = %s"
        return bool(await query(instance.pool, q, name))

    await wait_for(held, timeout=30, what="the message routed to the paused stream")
    await applied(instance, name, "reset")
    await applied(instance, name, "start")
    (letter,) = (await instance.api.get("/v1/dead-letters", params={"employee": name})).json()[
        "dead_letters"
    ]
    assert letter["reason"] == "reset"
    argv = ["replay", "--selector", f"id={letter['id']}", "--yes",
            "--url", ingress_url, "--token", ADMIN_TOKEN]  # fmt: skip
    assert await asyncio.to_thread(main, argv) == 0
    assert "are you there?" in await instance.reply(message, timeout=60, name=name)
    turns = await query(instance.pool, "SELECT stream_key FROM turns WHERE employee = %s", name)
    assert [t["stream_key"] for t in turns] == [f"{name}/g2/talk/main"]
