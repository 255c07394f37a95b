"""The local provider: deterministic, labelled replies; scripted tool calls, sleeps and failures."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta

import httpx
import pytest
from conftest import PURPOSES, PURPOSES_VAR
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from eventos.contracts import ChatMessage, LlmStepInput, ModelRef, ToolCall
from eventos.llm.endpoints import OPENAI_BASE_URL, Endpoint, LlmEndpoints
from eventos.llm.local import LocalProvider
from eventos.llm.openai import OpenAIChatProvider, status_error
from eventos.llm.providers import provider_for
from eventos.settings import SecretStore

LOCAL = ModelRef(provider="local", name="scripted")


def step_of(*messages: ChatMessage, turn_id: str = "turn-1", step: int = 0) -> LlmStepInput:
    return LlmStepInput(
        employee="support",
        turn_id=turn_id,
        step=step,
        klass=2,
        model=LOCAL,
        messages=list(messages),
    )


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


async def test_a_plain_message_gets_a_labelled_quote_and_word_counts() -> None:
    step = step_of(ChatMessage("system", "You answer customers."), user("where is my parcel?"))
    out = await LocalProvider().complete(step)
    assert out.message == ChatMessage("assistant", "[local] you said: where is my parcel?")
    assert out.finish_reason == "stop"
    assert out.input_tokens == 3 + 4
    assert out.output_tokens == 7


async def test_answers_are_deterministic() -> None:
    step = step_of(user("hello there"))
    first, second = await LocalProvider().complete(step), await LocalProvider().complete(step)
    assert first == second


async def test_the_reply_is_cut_at_max_tokens() -> None:
    step = LlmStepInput("e", "t", 0, 2, LOCAL, [user("one two three four five six")], max_tokens=4)
    out = await LocalProvider().complete(step)
    assert out.message.content == "[local] you said: one"
    assert (out.finish_reason, out.output_tokens) == ("length", 4)


async def test_call_lines_make_one_batch_with_ids_from_turn_step_and_index() -> None:
    text = 'look these up\ncall: lookup_order {"order": 42}\ncall: weather {"city": "Berlin"}\ncall: ping'
    out = await LocalProvider().complete(step_of(user(text), turn_id="turn-7", step=3))
    calls = out.message.tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("lookup_order", {"order": 42}),
        ("weather", {"city": "Berlin"}),
        ("ping", {}),
    ]
    assert out.finish_reason == "tool_calls"
    assert out.message.content == ""
    assert len({c.id for c in calls}) == 3 and all(c.id.startswith("call_") for c in calls)
    again = await LocalProvider().complete(step_of(user(text), turn_id="turn-7", step=3))
    assert [c.id for c in again.message.tool_calls] == [c.id for c in calls]
    elsewhere = await LocalProvider().complete(step_of(user(text), turn_id="turn-7", step=4))
    assert not {c.id for c in elsewhere.message.tool_calls} & {c.id for c in calls}


async def test_only_the_last_user_message_is_a_script() -> None:
    old = user("call: lookup_order {}")
    out = await LocalProvider().complete(
        step_of(old, ChatMessage("assistant", "ok"), user("thanks"))
    )
    assert out.message.tool_calls == []
    assert out.message.content == "[local] you said: thanks"


async def test_tool_results_get_a_final_text_naming_each_result() -> None:
    calls = [
        ToolCall("call_a", "lookup_order", '{"order": 42}'),
        ToolCall("call_b", "weather", "{}"),
    ]
    step = step_of(
        user("call: lookup_order {}"),
        ChatMessage("assistant", "", tool_calls=calls),
        ChatMessage("tool", '{"status": "shipped"}', tool_call_id="call_a"),
        ChatMessage("tool", "sunny, 21 C", tool_call_id="call_b"),
    )
    out = await LocalProvider().complete(step)
    assert out.message.tool_calls == []
    assert out.finish_reason == "stop"
    assert out.message.content == (
        '[local] tool results: lookup_order returned {"status": "shipped"}; '
        "weather returned sunny, 21 C"
    )


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (429, "ProviderRateLimited", True),
        (503, "ProviderUnavailable", True),
        (500, "ProviderServerError", True),
        (401, "ProviderAuthError", False),
        (400, "ProviderBadRequest", False),
    ],
)
async def test_fail_lines_raise_what_the_http_client_raises(
    status: int, kind: str, retryable: bool
) -> None:
    with pytest.raises(ApplicationError) as caught:
        await LocalProvider().complete(step_of(user(f"please\nfail: {status}")))
    expected = status_error(status, {}, model="scripted")
    assert (caught.value.type, caught.value.non_retryable) == (kind, not retryable)
    assert (caught.value.type, caught.value.non_retryable, caught.value.category) == (
        expected.type,
        expected.non_retryable,
        expected.category,
    )
    assert "please" not in str(caught.value)


async def test_fail_with_retry_after_and_an_attempt_count() -> None:
    step = step_of(user("hi\nfail: 429 2 retry-after=1"))
    for attempt in (1, 2):
        with pytest.raises(ApplicationError) as caught:
            await LocalProvider().complete(step, attempt)
        assert caught.value.next_retry_delay == timedelta(seconds=1)
        assert caught.value.category == ApplicationErrorCategory.BENIGN
    out = await LocalProvider().complete(step, 3)
    assert out.message.content == "[local] you said: hi"


async def test_a_sleep_line_delays_the_answer() -> None:
    started = time.monotonic()
    out = await LocalProvider().complete(step_of(user("slow one\nsleep: 0.3")))
    assert time.monotonic() - started >= 0.3
    assert out.message.content == "[local] you said: slow one"


async def test_a_sleeping_step_is_cancelled_promptly() -> None:
    task = asyncio.create_task(LocalProvider().complete(step_of(user("sleep: 60"))))
    await asyncio.sleep(0)  # let it reach its sleep
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert time.monotonic() - started < 1


async def test_provider_for_picks_by_provider_name() -> None:
    secrets = SecretStore(env={PURPOSES_VAR: PURPOSES, "EVENTOS_SECRET_OPENAI_MAIN": "sk-test"})
    async with httpx.AsyncClient() as http:
        default = LlmEndpoints((Endpoint("openai", OPENAI_BASE_URL, ("openai-main",)),))
        assert isinstance(provider_for(LOCAL, LlmEndpoints(()), secrets, http), LocalProvider)
        model = ModelRef("openai", "gpt-4o-mini", "openai-main")
        openai = provider_for(model, default, secrets, http)
        assert isinstance(openai, OpenAIChatProvider)
        assert openai.key == "sk-test" and "sk-test" not in repr(openai)
        assert openai.base_url == "https://api.openai.com/v1"
        ollama = LlmEndpoints((Endpoint("ollama", "http://127.0.0.1:11434/v1"),))
        gateway = provider_for(
            ModelRef("openai", "llama3", base_url="http://127.0.0.1:11434/v1"),
            ollama,
            secrets,
            http,
        )
        assert isinstance(gateway, OpenAIChatProvider) and gateway.key is None
        with pytest.raises(ApplicationError) as missing:
            anyone = LlmEndpoints((Endpoint("openai", OPENAI_BASE_URL, ("*",)),))
            provider_for(ModelRef("openai", "gpt-4o", "not-there"), anyone, secrets, http)
        assert (missing.value.type, missing.value.non_retryable) == (
            "ProviderCredentialMissing",
            True,
        )
        with pytest.raises(ApplicationError) as unknown:
            provider_for(ModelRef("anthropic", "claude"), default, secrets, http)
        assert (unknown.value.type, unknown.value.non_retryable) == ("ProviderUnknown", True)


async def test_a_say_line_is_the_reply_verbatim_once_decoded() -> None:
    out = await LocalProvider().complete(step_of(ChatMessage("user", 'x\nsay: "a\\u0000b"')))
    assert out.message.content == "[local] a\x00b"
    bad = await LocalProvider().complete(step_of(ChatMessage("user", "say: not json")))
    assert "say: not json" in bad.message.content  # not a string: quoted like any text
