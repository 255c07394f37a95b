"""Parking (SPEC §9): a step failing for a reason that may clear (a missing key, billing or
quota) parks its turn instead of failing it: no slot held, an attention item with the reason;
a top-up or Resume releases it and the turn goes on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import pytest
from fake_openai import KEY, Answer, FakeOpenAI
from test_budget import chat
from test_router import query
from test_supervision import applied, new_employee, post
from test_turns import Instance, instance  # noqa: F401 (`instance` is a fixture)

from eventos import names
from eventos.llm.endpoints import Endpoint, LlmEndpoints
from eventos.testing import wait_for


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def llm_endpoints(fake: FakeOpenAI) -> LlmEndpoints:
    """The operator allows the fake, with any credential (the tests name one per employee)."""
    return LlmEndpoints((Endpoint("fake", fake.base_url, ("*",)),))


def on(fake: FakeOpenAI):  # type: ignore[no-untyped-def]
    def spec(name: str) -> str:
        model = (f"{{provider: openai, name: gpt-4o-mini, credential: key-{name}, "
                 f"base_url: '{fake.base_url}'}}")  # fmt: skip
        return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents: [{{name: front, model: {model}}}]
  triggers:
    - {{kind: chat}}
"""

    return spec


async def parked(instance: Instance, name: str, why: str) -> dict[str, object]:
    """The employee's turn holds a suspended lease parked for `why`, with an attention item."""

    async def check() -> dict[str, object] | None:
        q = ("SELECT l.turn_id, l.suspended_reason, a.detail FROM sched_leases l "
             "JOIN attention_items a ON a.ref = l.turn_id AND a.kind = %s AND a.state = 'open' "
             "WHERE l.employee = %s AND l.state = 'suspended'")  # fmt: skip
        rows = await query(instance.pool, q, names.ATTENTION_PARKED_TURN, name)
        return rows[0] if rows else None

    row = await wait_for(check, timeout=20, what=f"a turn parked for {why}")
    assert row["suspended_reason"] == f"parked: {why}"
    return row


async def test_a_missing_key_parks_the_turn_and_a_top_up_releases_it(
    instance: Instance, fake: FakeOpenAI
) -> None:
    name = await new_employee(instance, on(fake))
    await applied(instance, name, "start")
    message = await chat(instance, name, "hello")
    row = await parked(instance, name, "ProviderCredentialMissing")
    assert fake.requests == []
    # The key arrives (a mounted Secret updated), then a top-up releases the parked turn.
    cast(dict[str, str], instance.llm.secrets.env)[f"EVENTOS_SECRET_KEY_{name.upper()}"] = KEY
    await post(instance, f"/v1/employees/{name}/limits", json={"daily_usd": 5})
    assert await instance.reply(message, timeout=30, name=name) == "Hello from the fake."
    turns = await query(instance.pool, "SELECT id, status FROM turns WHERE employee = %s", name)
    assert turns == [{"id": row["turn_id"], "status": "done"}]  # the same turn went on
    items = await query(instance.pool, "SELECT state FROM attention_items WHERE ref = %s",
                        row["turn_id"])  # fmt: skip
    assert items == [{"state": "resolved"}]


async def test_exhausted_quota_parks_the_turn_and_resume_runs_its_input(
    instance: Instance, fake: FakeOpenAI
) -> None:
    name = await new_employee(instance, on(fake))
    cast(dict[str, str], instance.llm.secrets.env)[f"EVENTOS_SECRET_KEY_{name.upper()}"] = KEY
    await applied(instance, name, "start")
    fake.queue(Answer(status=429, code="insufficient_quota"))
    message = await chat(instance, name, "hello")
    await parked(instance, name, "ProviderQuotaExceeded")
    assert len(fake.requests) == 1  # billing is not retried
    await applied(instance, name, "stop")
    await applied(instance, name, "resume")
    assert await instance.reply(message, timeout=30, name=name) == "Hello from the fake."
    q = "SELECT status FROM turns WHERE employee = %s ORDER BY started_at"
    statuses = [r["status"] for r in await query(instance.pool, q, name)]
    assert statuses[-1] == "done" and "failed" not in statuses


async def test_a_turn_parked_for_7_days_dead_letters_its_inputs(
    instance: Instance, fake: FakeOpenAI
) -> None:
    """The park's age is the database's (a clock the test moves): asking again after 7 days
    parked, the turn ends and its inputs are dead-lettered at once, without a second try."""
    name = await new_employee(instance, on(fake))
    await applied(instance, name, "start")
    message = await chat(instance, name, "hello")
    row = await parked(instance, name, "ProviderCredentialMissing")
    async with instance.pool.connection() as conn:
        await conn.execute("UPDATE turns SET parked_at = now() - interval '8 days' WHERE id = %s",
                           (row["turn_id"],))  # fmt: skip
    await post(instance, f"/v1/employees/{name}/limits", json={"daily_usd": 5})  # releases it

    async def dead() -> dict[str, object] | None:
        q = ("SELECT d.status, d.reason FROM bus_deliveries d JOIN bus_streams s "
             "ON s.stream_key = d.stream_key WHERE s.employee = %s AND d.status = 'dead'")  # fmt: skip
        rows = await query(instance.pool, q, name)
        return rows[0] if rows else None

    delivery = await wait_for(dead, timeout=30, what="the input dead-lettered")
    assert delivery["reason"] == (
        "parked for 7 days (parked: ProviderCredentialMissing): auth: ProviderCredentialMissing: "
        f"credential 'key-{name}' is not available: secret 'key-{name}' is not available"
    )  # the park's cause (eventos.failures)
    turns = await query(instance.pool, "SELECT status FROM turns WHERE employee = %s", name)
    assert turns == [{"status": "failed"}]  # no second turn tried it
    q = "SELECT status FROM chat_messages WHERE employee = %s AND id = %s"
    assert await query(instance.pool, q, name, message) == [{"status": "dead"}]
    kinds = await query(instance.pool, "SELECT kind FROM attention_items WHERE employee = %s "
                        "AND state = 'open'", name)  # fmt: skip
    assert {"kind": names.ATTENTION_DEAD_INPUT} in kinds


async def test_an_endpoint_dropped_from_the_list_parks_the_turn_and_sends_no_key(
    instance: Instance, fake: FakeOpenAI
) -> None:
    """Applied while the fake was allowed; the LLM workers' list changed since (a restart with
    another EVENTOS_LLM_ENDPOINTS): the step is refused at call time, nothing reaches the fake,
    and the turn parks until the operator puts it back."""
    name = await new_employee(instance, on(fake))
    cast(dict[str, str], instance.llm.secrets.env)[f"EVENTOS_SECRET_KEY_{name.upper()}"] = KEY
    await applied(instance, name, "start")
    allowed, instance.llm.endpoints = instance.llm.endpoints, LlmEndpoints()
    message = await chat(instance, name, "hello")
    row = await parked(instance, name, names.LLM_ENDPOINT_NOT_ALLOWED)
    assert fake.requests == []
    assert names.LLM_ENDPOINT_NOT_ALLOWED in str(row["detail"])
    instance.llm.endpoints = allowed
    await post(instance, f"/v1/employees/{name}/limits", json={"daily_usd": 5})
    assert await instance.reply(message, timeout=30, name=name) == "Hello from the fake."
    [seen] = fake.requests
    assert seen.headers["authorization"] == f"Bearer {KEY}"
