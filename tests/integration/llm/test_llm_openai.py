"""The OpenAI-compatible provider against a loopback fake of the API: request shapes, replies,
and how every kind of failure is classified for Temporal."""

from __future__ import annotations

import email.utils
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from conftest import PURPOSES, PURPOSES_VAR
from fake_openai import KEY, Answer, FakeOpenAI
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from eventos import failures
from eventos.contracts import ChatMessage, LlmStepInput, ModelRef, ToolCall, ToolSpec
from eventos.llm.endpoints import Endpoint, LlmEndpoints
from eventos.llm.openai import OpenAIChatProvider
from eventos.llm.providers import provider_for
from eventos.settings import SecretStore

PROMPT = "my parcel 7731-zebra never arrived"
SECRETS = SecretStore(env={PURPOSES_VAR: PURPOSES, "EVENTOS_SECRET_FAKE_OPENAI": KEY})
LOOKUP = ToolSpec(
    "lookup_order",
    "Find an order by number.",
    {"type": "object", "properties": {"order": {"type": "integer"}}, "required": ["order"]},
)
WEATHER = ToolSpec("weather", "Weather in a city.", {"type": "object", "properties": {}})


@pytest.fixture(scope="module")
async def fake_server() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def fake(fake_server: FakeOpenAI) -> FakeOpenAI:
    """The module's fake, with no queued answers and no requests seen."""
    fake_server.reset()
    return fake_server


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as client:
        yield client


def model_at(base_url: str, credential: str | None = "fake-openai") -> ModelRef:
    return ModelRef("openai", "gpt-4o-mini", credential, base_url)


def allowing(base_url: str, *credentials: str) -> LlmEndpoints:
    """The operator's list: one endpoint `fake` at `base_url` (credential `fake-openai`)."""
    return LlmEndpoints((Endpoint("fake", base_url, credentials or ("fake-openai",)),))


def step_of(
    model: ModelRef, *messages: ChatMessage, tools: list[ToolSpec] | None = None
) -> LlmStepInput:
    msgs = list(messages) or [ChatMessage("user", PROMPT)]
    return LlmStepInput("support", "turn-1", 0, 2, model, msgs, tools or [], max_tokens=256)


def provider(fake: FakeOpenAI, http: httpx.AsyncClient, key: str = KEY) -> OpenAIChatProvider:
    secrets = SecretStore(env={PURPOSES_VAR: PURPOSES, "EVENTOS_SECRET_FAKE_OPENAI": key})
    chosen = provider_for(model_at(fake.base_url), allowing(fake.base_url), secrets, http)
    assert isinstance(chosen, OpenAIChatProvider)
    return chosen


async def test_a_transcript_with_tool_calls_and_results_is_sent_in_openai_shape(
    fake: FakeOpenAI, http: httpx.AsyncClient
) -> None:
    calls = [
        ToolCall("call_a", "lookup_order", '{"order": 42}'),
        ToolCall("call_b", "weather", "{}"),
    ]
    step = step_of(
        model_at(fake.base_url),
        ChatMessage("system", "You answer customers of ACME."),
        ChatMessage("user", PROMPT, name="alice"),
        ChatMessage("assistant", "", tool_calls=calls),
        ChatMessage("tool", '{"status": "shipped"}', tool_call_id="call_a"),
        ChatMessage("tool", "sunny", tool_call_id="call_b"),
        tools=[LOOKUP, WEATHER],
    )
    fake.queue(Answer(content="It shipped yesterday.", usage=(120, 6)))
    out = await provider(fake, http).complete(step)

    assert out.message == ChatMessage("assistant", "It shipped yesterday.")
    assert (out.finish_reason, out.input_tokens, out.output_tokens) == ("stop", 120, 6)
    [seen] = fake.requests
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.headers["content-type"] == "application/json"
    assert seen.body == {
        "model": "gpt-4o-mini",
        "max_tokens": 256,
        "messages": [
            {"role": "system", "content": "You answer customers of ACME."},
            {"role": "user", "content": PROMPT, "name": "alice"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order": 42}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": '{"status": "shipped"}'},
            {"role": "tool", "tool_call_id": "call_b", "content": "sunny"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup_order",
                    "description": "Find an order by number.",
                    "parameters": LOOKUP.parameters,
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Weather in a city.",
                    "parameters": {"type": "object", "properties": {}},
                },
            },
        ],
    }


@pytest.mark.parametrize("name", ["o1", "o3-mini", "o4-mini", "gpt-5", "gpt-5-mini", "gpt-5.1"])
async def test_a_reasoning_model_gets_its_token_limit_as_max_completion_tokens(
    fake: FakeOpenAI, http: httpx.AsyncClient, name: str
) -> None:
    model = replace(model_at(fake.base_url), name=name)
    out = await provider(fake, http).complete(step_of(model))
    assert out.message.content == "Hello from the fake."
    [seen] = fake.requests
    assert seen.body["max_completion_tokens"] == 256
    assert "max_tokens" not in seen.body


@pytest.mark.parametrize("name", ["gpt-4o-mini", "gpt-4.1", "llama3", "Qwen/Qwen3-8B"])
async def test_any_other_model_gets_max_tokens_the_name_every_compatible_server_knows(
    fake: FakeOpenAI, http: httpx.AsyncClient, name: str
) -> None:
    model = replace(model_at(fake.base_url), name=name)
    await provider(fake, http).complete(step_of(model))
    [seen] = fake.requests
    assert seen.body["max_tokens"] == 256
    assert "max_completion_tokens" not in seen.body


async def test_the_spec_option_names_the_token_limit_field_whatever_the_family(
    fake: FakeOpenAI, http: httpx.AsyncClient
) -> None:
    classic = replace(model_at(fake.base_url), token_limit_param="max_completion_tokens")
    out = await provider(fake, http).complete(step_of(classic))  # current chat models take it
    assert out.message.content == "Hello from the fake."
    assert fake.requests[0].body["max_completion_tokens"] == 256
    assert "max_tokens" not in fake.requests[0].body

    reasoning = replace(model_at(fake.base_url), name="o4-mini", token_limit_param="max_tokens")
    with pytest.raises(ApplicationError) as caught:
        await provider(fake, http).complete(step_of(reasoning))
    assert (caught.value.type, caught.value.non_retryable) == ("ProviderBadRequest", True)
    assert "HTTP 400 (unsupported_parameter)" in str(caught.value)
    assert fake.requests[1].body["max_tokens"] == 256


async def test_the_fake_refuses_max_tokens_to_a_reasoning_model_as_the_api_does(
    fake: FakeOpenAI, http: httpx.AsyncClient
) -> None:
    body = {"model": "o4-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    r = await http.post(
        fake.base_url + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "unsupported_parameter",
        }
    }
    classic = {**body, "model": "gpt-4o"}
    for field in ("max_tokens", "max_completion_tokens"):
        limit = {field: 9}
        r = await http.post(
            fake.base_url + "/chat/completions",
            json={**{k: v for k, v in classic.items() if k != "max_tokens"}, **limit},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert r.status_code == 200, r.text


async def test_a_batch_of_tool_calls_with_null_content_is_parsed(
    fake: FakeOpenAI, http: httpx.AsyncClient
) -> None:
    fake.queue(
        Answer(
            tool_calls=[
                ("call_1", "lookup_order", '{"order":42}'),
                ("call_2", "weather", '{"city":"Berlin"}'),
            ],
            usage=(80, 31),
        )
    )
    out = await provider(fake, http).complete(
        step_of(model_at(fake.base_url), tools=[LOOKUP, WEATHER])
    )
    assert out.message.content == ""
    assert out.message.tool_calls == [
        ToolCall("call_1", "lookup_order", '{"order":42}'),
        ToolCall("call_2", "weather", '{"city":"Berlin"}'),
    ]
    assert (out.finish_reason, out.input_tokens, out.output_tokens) == ("tool_calls", 80, 31)


async def test_without_tools_no_tools_argument_is_sent(
    fake: FakeOpenAI, http: httpx.AsyncClient
) -> None:
    out = await provider(fake, http).complete(step_of(model_at(fake.base_url)))
    assert out.message.content == "Hello from the fake."
    assert out.input_tokens > 0 and out.output_tokens > 0
    assert "tools" not in fake.requests[0].body


async def test_a_gateway_without_credential_gets_no_authorization_header(
    http: httpx.AsyncClient,
) -> None:
    gateway = FakeOpenAI(key=None)
    await gateway.start()
    try:
        model = model_at(gateway.base_url + "/", credential=None)  # the slash is not a new URL
        chosen = provider_for(model, allowing(gateway.base_url), SECRETS, http)
        out = await chosen.complete(step_of(model_at(gateway.base_url, None)))
    finally:
        await gateway.stop()
    assert out.message.content == "Hello from the fake."
    assert "authorization" not in gateway.requests[0].headers


async def test_a_wrong_key_is_a_non_retryable_auth_error_that_does_not_quote_it(
    fake: FakeOpenAI, http: httpx.AsyncClient
) -> None:
    wrong = "sk-wrong-key-ffffffffffffffffffff1234"
    with pytest.raises(ApplicationError) as caught:
        await provider(fake, http, key=wrong).complete(step_of(model_at(fake.base_url)))
    assert (caught.value.type, caught.value.non_retryable) == ("ProviderAuthError", True)
    assert caught.value.details[0]["code"] == "invalid_api_key"
    text = f"{caught.value} {caught.value.details!r}"
    assert wrong not in text and "1234" not in text and PROMPT not in text


def _date_in(seconds: float) -> str:
    return email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), usegmt=True)


# (status, headers, error code) → (type, retryable, benign, Retry-After delay range in seconds,
# the failure's category)
ROWS = [
    (
        429,
        {"retry-after": "1"},
        "rate_limit_exceeded",
        "ProviderRateLimited",
        True,
        True,
        (1, 1),
        "rate",
    ),
    (429, {}, "rate_limit_exceeded", "ProviderRateLimited", True, True, None, "rate"),
    (429, {"retry-after": "3600"}, None, "ProviderRateLimited", True, True, (300, 300), "rate"),
    (429, {"retry-after-ms": "1500"}, None, "ProviderRateLimited", True, True, (1.5, 1.5), "rate"),
    (429, {}, "insufficient_quota", "ProviderQuotaExceeded", False, False, None, "quota"),
    (503, {"retry-after": "2"}, None, "ProviderUnavailable", True, True, (2, 2), "outage"),
    (503, {}, None, "ProviderUnavailable", True, True, None, "outage"),
    (409, {}, None, "ProviderConflict", True, False, None, "invalid_request"),
    (
        400,
        {"x-should-retry": "true"},
        None,
        "ProviderBadRequest",
        True,
        False,
        None,
        "invalid_request",
    ),
    (500, {"x-should-retry": "false"}, None, "ProviderServerError", False, False, None, "outage"),
    (408, {}, None, "ProviderTimeout", True, False, None, "timeout"),
    (500, {}, None, "ProviderServerError", True, False, None, "outage"),
    (502, {}, None, "ProviderServerError", True, False, None, "outage"),
    (504, {}, None, "ProviderTimeout", True, False, None, "timeout"),
    (400, {}, None, "ProviderBadRequest", False, False, None, "invalid_request"),
    (401, {}, None, "ProviderAuthError", False, False, None, "auth"),
    (402, {}, None, "ProviderQuotaExceeded", False, False, None, "quota"),
    (403, {}, None, "ProviderAuthError", False, False, None, "auth"),
    (404, {}, "model_not_found", "ProviderNotFound", False, False, None, "invalid_request"),
    (422, {}, None, "ProviderBadRequest", False, False, None, "invalid_request"),
]


@pytest.mark.parametrize(
    ("status", "headers", "code", "kind", "retryable", "benign", "delay", "cause"),
    ROWS,
    ids=[f"{r[0]}-{r[3]}-{'+'.join(r[1]) or 'plain'}-{r[2] or ''}" for r in ROWS],
)
async def test_each_error_answer_is_classified_once_without_quoting_content(
    fake: FakeOpenAI,
    http: httpx.AsyncClient,
    status: int,
    headers: dict[str, str],
    code: str | None,
    kind: str,
    retryable: bool,
    benign: bool,
    delay: tuple[float, float] | None,
    cause: str,
) -> None:
    fake.queue(Answer(status=status, headers=headers, code=code))
    with pytest.raises(ApplicationError) as caught:
        await provider(fake, http).complete(step_of(model_at(fake.base_url)))
    err = caught.value
    assert (err.type, err.non_retryable) == (kind, not retryable)
    category = ApplicationErrorCategory.BENIGN if benign else ApplicationErrorCategory.UNSPECIFIED
    assert err.category == category
    if delay is None:
        assert err.next_retry_delay is None
    else:
        assert err.next_retry_delay is not None
        assert delay[0] <= err.next_retry_delay.total_seconds() <= delay[1]
    assert err.details[0]["status"] == status
    assert err.details[0]["category"] == cause == failures.describe(err).category
    assert len(fake.requests) == 1  # the client never retries by itself
    text = f"{err} {err.details!r}"
    assert "zebra" not in text and KEY[:8] not in text and "not allowed" not in text
    assert f"HTTP {status}" in str(err) and "request req_" in str(err)


async def test_retry_after_as_an_http_date(fake: FakeOpenAI, http: httpx.AsyncClient) -> None:
    fake.queue(Answer(status=503, headers={"retry-after": _date_in(3)}))
    with pytest.raises(ApplicationError) as caught:
        await provider(fake, http).complete(step_of(model_at(fake.base_url)))
    assert caught.value.next_retry_delay is not None
    assert 1.0 <= caught.value.next_retry_delay.total_seconds() <= 3.0
    assert caught.value.category == ApplicationErrorCategory.BENIGN
    assert not caught.value.non_retryable


async def test_a_request_the_api_rejects_is_a_bad_request(
    fake: FakeOpenAI, http: httpx.AsyncClient
) -> None:
    orphan = ChatMessage("tool", "result", tool_call_id="call_nobody_made")
    with pytest.raises(ApplicationError) as caught:
        await provider(fake, http).complete(
            step_of(model_at(fake.base_url), ChatMessage("user", PROMPT), orphan)
        )
    assert (caught.value.type, caught.value.non_retryable) == ("ProviderBadRequest", True)


async def test_a_hanging_server_is_a_retryable_timeout(fake: FakeOpenAI) -> None:
    fake.queue(Answer(hang=True))
    async with httpx.AsyncClient(timeout=httpx.Timeout(0.5)) as impatient:
        with pytest.raises(ApplicationError) as caught:
            await provider(fake, impatient).complete(step_of(model_at(fake.base_url)))
    assert (caught.value.type, caught.value.non_retryable) == ("ProviderTimeout", False)
    assert len(fake.requests) == 1


async def test_a_refused_connection_is_retryable(http: httpx.AsyncClient) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before use: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    closed = provider_for(model_at(url), allowing(url), SECRETS, http)
    with pytest.raises(ApplicationError) as caught:
        await closed.complete(step_of(model_at(f"http://127.0.0.1:{port}/v1")))
    assert (caught.value.type, caught.value.non_retryable) == ("ProviderUnreachable", False)


@pytest.mark.parametrize(
    "raw", ["<html>Bad gateway</html>", '{"choices": []}', '{"object": "chat.completion"}']
)
async def test_a_malformed_success_is_a_retryable_bad_response(
    fake: FakeOpenAI, http: httpx.AsyncClient, raw: str
) -> None:
    fake.queue(Answer(raw=raw))
    with pytest.raises(ApplicationError) as caught:
        await provider(fake, http).complete(step_of(model_at(fake.base_url)))
    assert (caught.value.type, caught.value.non_retryable) == ("ProviderBadResponse", False)


async def test_a_named_endpoint_is_called_at_the_operators_base_url(
    fake: FakeOpenAI, http: httpx.AsyncClient
) -> None:
    model = ModelRef("openai", "gpt-4o-mini", "fake-openai", endpoint="fake")
    chosen = provider_for(model, allowing(fake.base_url), SECRETS, http)
    out = await chosen.complete(step_of(model))
    assert out.message.content == "Hello from the fake."
    [seen] = fake.requests
    assert seen.headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize(
    ("model", "endpoints", "field"),
    [
        # The spec's base_url alone: the operator's list (here the default) does not have it.
        (lambda url: model_at(url), lambda url: LlmEndpoints(), "base_url"),
        # An endpoint that does not allow this credential.
        (lambda url: model_at(url), lambda url: allowing(url, "another-key"), "credential"),
        # A named endpoint with a base_url of the spec's own.
        (
            lambda url: ModelRef("openai", "gpt-4o-mini", "fake-openai", url, "openai"),
            lambda url: LlmEndpoints(),
            "base_url",
        ),
        (
            lambda url: ModelRef("openai", "gpt-4o-mini", "fake-openai", endpoint="gone"),
            lambda url: allowing(url),
            "endpoint",
        ),
    ],
    ids=["base-url-not-listed", "credential-not-allowed", "base-url-not-the-endpoints", "no-such"],
)
async def test_a_model_off_the_operators_list_fails_non_retryably_and_sends_nothing(
    fake: FakeOpenAI, http: httpx.AsyncClient, model: Any, endpoints: Any, field: str
) -> None:
    with pytest.raises(ApplicationError) as caught:
        provider_for(model(fake.base_url), endpoints(fake.base_url), SECRETS, http)
    assert (caught.value.type, caught.value.non_retryable) == ("LlmEndpointNotAllowed", True)
    assert f": {field}: " in str(caught.value) and "EVENTOS_LLM_ENDPOINTS" in str(caught.value)
    assert KEY not in str(caught.value)
    assert fake.requests == []
