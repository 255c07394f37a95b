"""A turn calls its model with the request fields that model takes: OpenAI's reasoning families
get their token limit as `max_completion_tokens` (they refuse `max_tokens`), and the spec's
`model.options.token_limit_param` overrides the guess, all the way from apply to the request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import pytest
from fake_openai import KEY, FakeOpenAI
from test_budget import chat
from test_supervision import applied, new_employee
from test_turns import Instance, instance  # noqa: F401 (`instance` is a fixture)

from eventos.llm.endpoints import Endpoint, LlmEndpoints


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def llm_endpoints(fake: FakeOpenAI) -> LlmEndpoints:
    return LlmEndpoints((Endpoint("fake", fake.base_url, ("*",)),))


def on(fake: FakeOpenAI, model_name: str, options: str = ""):  # type: ignore[no-untyped-def]
    def spec(name: str) -> str:
        extra = f", options: {options}" if options else ""
        model = (f"{{provider: openai, name: {model_name}, credential: key-{name}, "
                 f"base_url: '{fake.base_url}'{extra}}}")  # fmt: skip
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


async def answered(instance: Instance, fake: FakeOpenAI, spec) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Apply, start and chat once; the reply comes back; the request the fake saw."""
    name = await new_employee(instance, spec)
    cast(dict[str, str], instance.llm.secrets.env)[f"EVENTOS_SECRET_KEY_{name.upper()}"] = KEY
    await applied(instance, name, "start")
    message = await chat(instance, name, "hello")
    assert await instance.reply(message, timeout=30, name=name) == "Hello from the fake."
    [seen] = fake.requests
    return cast(dict[str, object], seen.body)


async def test_a_reasoning_model_answers_a_turn(instance: Instance, fake: FakeOpenAI) -> None:
    body = await answered(instance, fake, on(fake, "o4-mini"))
    assert "max_tokens" not in body and isinstance(body["max_completion_tokens"], int)


async def test_the_spec_option_chooses_the_token_limit_field(
    instance: Instance, fake: FakeOpenAI
) -> None:
    options = "{token_limit_param: max_completion_tokens}"
    body = await answered(instance, fake, on(fake, "gpt-4o-mini", options))
    assert "max_tokens" not in body and isinstance(body["max_completion_tokens"], int)
