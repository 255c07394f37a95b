"""Failures say why (issue 26): a turn whose model answers 401, 429 or 500 shows the cause's
category and the provider's status in the timeline, the attention item, the dead letter and
`eventosctl describe`, never Temporal's outer "Activity task failed"; and never what the
provider's error quoted (the owner's message, the key)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest
from conftest import ADMIN_TOKEN
from fake_openai import KEY, Answer, FakeOpenAI
from metrics_table import sample
from test_budget import chat
from test_parking import fake, llm_endpoints, on, parked  # noqa: F401 (fixtures)
from test_router import query
from test_supervision import applied, new_employee, post
from test_turns import Instance, instance  # noqa: F401 (`instance` is a fixture)

from eventos import names
from eventos.cli import main
from eventos.runtime.metrics import TURN_FAILURES
from eventos.testing import wait_for

SECRET_TEXT = "my locker code is zebra-4471"  # what the owner wrote; the fake's error quotes it
OUTER = "Activity task failed"


async def describe(ingress_url: str, name: str) -> str:
    """`eventosctl describe NAME` as text (main() in a thread: the ingress runs on this loop)."""

    def run() -> str:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["describe", name, "--url", ingress_url, "--token", ADMIN_TOKEN]) == 0
        return out.getvalue()

    return await asyncio.to_thread(run)


async def surfaces(at: Instance, ingress_url: str, name: str) -> dict[str, str]:
    """What the operator reads of the employee, each surface as one text."""
    api = at.api
    timeline = (await api.get(f"/v1/employees/{name}/timeline?limit=50")).json()["timeline"]
    attention = (await api.get(f"/v1/attention?employee={name}&state=open")).json()["attention"]
    letters = (await api.get(f"/v1/dead-letters?employee={name}")).json()["dead_letters"]
    return {
        "timeline": "\n".join(f"{e['kind']} {e['summary']}" for e in timeline),
        "attention": "\n".join(f"{i['kind']} {i['detail']}" for i in attention),
        "dead letters": "\n".join(f"{d['reason']} {d['detail']}" for d in letters),
        "describe": await describe(ingress_url, name),
    }


def assert_says(texts: dict[str, str], *wanted: str) -> None:
    for surface, text in texts.items():
        for words in wanted:
            assert words in text, (surface, words, text)
        for leak in (OUTER, "zebra", KEY[:8]):
            assert leak not in text, (surface, leak, text)


async def dead_lettered(at: Instance, name: str) -> list[dict[str, Any]]:
    async def dead() -> list[dict[str, Any]] | None:
        q = ("SELECT d.reason FROM bus_deliveries d JOIN bus_streams s "
             "ON s.stream_key = d.stream_key WHERE s.employee = %s AND d.status = 'dead'")  # fmt: skip
        return await query(at.pool, q, name) or None

    return await wait_for(dead, timeout=60, what="the input dead-lettered")


@pytest.mark.parametrize(
    ("status", "category", "kind"),
    [(429, "rate", "ProviderRateLimited"), (500, "outage", "ProviderServerError")],
)
async def test_a_failing_model_says_its_category_and_status_everywhere(
    instance: Instance,  # noqa: F811
    fake: FakeOpenAI,  # noqa: F811
    ingress_url: str,
    status: int,
    category: str,
    kind: str,
) -> None:
    """The provider says not to retry (`x-should-retry: false`), so each turn fails at once;
    the input's second turn fails too and it is dead-lettered."""
    name = await new_employee(instance, on(fake))
    cast(dict[str, str], instance.llm.secrets.env)[f"EVENTOS_SECRET_KEY_{name.upper()}"] = KEY
    await applied(instance, name, "start")
    no_retry = Answer(status=status, headers={"x-should-retry": "false"})
    fake.queue(no_retry, no_retry)
    failed_before = sample(TURN_FAILURES, reason=category)
    await chat(instance, name, SECRET_TEXT)
    (delivery,) = await dead_lettered(instance, name)
    assert sample(TURN_FAILURES, reason=category) == failed_before + 2  # the category alone
    cause = f"{category}: {kind}: HTTP {status}"
    assert delivery["reason"].startswith(f"turn_failed: {cause}")
    turns = await query(instance.pool, "SELECT error FROM turns WHERE employee = %s", name)
    assert len(turns) == 2 and all(t["error"].startswith(cause) for t in turns)
    texts = await surfaces(instance, ingress_url, name)
    assert_says(texts, cause)
    assert "dead_input" in texts["attention"] and "turn.failed" in texts["timeline"]


async def test_a_refused_key_parks_with_its_cause_and_dead_letters_with_it(
    instance: Instance,  # noqa: F811
    fake: FakeOpenAI,  # noqa: F811
    ingress_url: str,
) -> None:
    """A 401 parks the turn (SPEC §9: a key may be fixed): the park says why, and so does the
    dead letter once it has been parked for 7 days (a clock the test moves)."""
    name = await new_employee(instance, on(fake))
    wrong = "sk-wrong-0123456789abcdefghijklmnop"
    cast(dict[str, str], instance.llm.secrets.env)[f"EVENTOS_SECRET_KEY_{name.upper()}"] = wrong
    await applied(instance, name, "start")
    await chat(instance, name, SECRET_TEXT)
    row = await parked(instance, name, "ProviderAuthError")
    cause = "auth: ProviderAuthError: HTTP 401 (invalid_api_key)"
    assert cause in str(row["detail"])
    texts = await surfaces(instance, ingress_url, name)
    del texts["dead letters"]  # none yet
    assert_says(texts, cause)
    assert "turn.parked" in texts["timeline"] and names.ATTENTION_PARKED_TURN in texts["attention"]
    for text in texts.values():
        assert wrong[:8] not in text

    async with instance.pool.connection() as conn:
        await conn.execute("UPDATE turns SET parked_at = now() - interval '8 days' WHERE id = %s",
                           (row["turn_id"],))  # fmt: skip
    await post(instance, f"/v1/employees/{name}/limits", json={"daily_usd": 5})  # releases it
    (delivery,) = await dead_lettered(instance, name)
    assert delivery["reason"].startswith("parked for 7 days (parked: ProviderAuthError): " + cause)
    texts = await surfaces(instance, ingress_url, name)
    assert_says(texts, cause)
    assert json.dumps(texts).count("HTTP 401") >= 4
