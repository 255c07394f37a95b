"""The operator's LLM endpoints (EVENTOS_LLM_ENDPOINTS): the format, the default, and which
models and credentials each lets through."""

from __future__ import annotations

import json

import pytest

from eventos.contracts import ModelRef
from eventos.errors import ConfigError, EndpointNotAllowed
from eventos.llm.endpoints import OPENAI_BASE_URL, VAR, Endpoint, LlmEndpoints

CONFIGURED = {
    "openai": {"base_url": "https://api.openai.com/v1/", "credentials": ["openai-main"]},
    "vllm": {"base_url": "http://vllm.models.svc:8000/v1"},
    "gateway": {"base_url": "https://LLM.example.com/v1", "credentials": ["*"]},
}


def endpoints() -> LlmEndpoints:
    return LlmEndpoints.from_env({VAR: json.dumps(CONFIGURED)})


def test_unset_allows_only_the_official_openai_endpoint_with_no_credential() -> None:
    default = LlmEndpoints.from_env({})
    assert default == LlmEndpoints.from_env({VAR: " "})
    assert default.endpoints == (Endpoint("openai", OPENAI_BASE_URL, ()),)
    chosen = default.resolve(ModelRef("openai", "gpt-4.1-mini"))
    assert chosen is not None and chosen.base_url == OPENAI_BASE_URL
    with pytest.raises(EndpointNotAllowed) as refused:  # which key goes there is the operator's
        default.resolve(ModelRef("openai", "gpt-4.1-mini", "openai-main"))
    assert refused.value.field == "credential"
    with pytest.raises(EndpointNotAllowed) as caught:
        default.resolve(ModelRef("openai", "m", "openai-main", "https://evil.example/v1"))
    assert caught.value.field == "base_url"
    assert str(caught.value) == f"not an allowed endpoint; allowed: openai ({VAR})"


def test_a_model_names_an_endpoint_or_gives_its_base_url() -> None:
    allowed = endpoints()
    named = allowed.resolve(ModelRef("openai", "llama", endpoint="vllm"))
    assert named is not None and named.base_url == "http://vllm.models.svc:8000/v1"
    # Scheme and host case and a trailing slash do not make another URL.
    by_url = allowed.resolve(ModelRef("openai", "m", "team-key", "https://llm.example.com/v1/"))
    assert by_url is not None and by_url.name == "gateway"
    same = allowed.resolve(ModelRef("openai", "m", None, "HTTP://vllm.models.svc:8000/v1", "vllm"))
    assert same is not None and same.name == "vllm"
    assert allowed.resolve(ModelRef("local", "scripted")) is None
    assert LlmEndpoints(()).resolve(ModelRef("local", "scripted", base_url="x")) is None


@pytest.mark.parametrize(
    ("model", "field", "message"),
    [
        (ModelRef("openai", "m", endpoint="nope"), "endpoint", "no endpoint named 'nope'"),
        (
            ModelRef("openai", "m", None, "http://vllm.models.svc:8001/v1", "vllm"),
            "base_url",
            "not the base_url of endpoint 'vllm'",
        ),
        (
            ModelRef("openai", "m", "stripe-whsec"),
            "credential",
            "endpoint 'openai' does not allow credential 'stripe-whsec'",
        ),
        (
            ModelRef("openai", "m", "openai-main", endpoint="vllm"),
            "credential",
            "endpoint 'vllm' does not allow credential 'openai-main'",
        ),
        (
            ModelRef("openai", "m", "openai-main", "https://api.openai.com/v1/../x"),
            "base_url",
            "not an allowed endpoint",
        ),
    ],
)
def test_anything_else_is_refused_naming_the_field(
    model: ModelRef, field: str, message: str
) -> None:
    with pytest.raises(EndpointNotAllowed, match=message) as caught:
        endpoints().resolve(model)
    assert caught.value.field == field


def test_an_empty_list_allows_only_the_local_provider() -> None:
    none = LlmEndpoints.from_env({VAR: "{}"})
    with pytest.raises(EndpointNotAllowed, match="no endpoint is configured") as caught:
        none.resolve(ModelRef("openai", "gpt-4.1-mini", "openai-main"))
    assert caught.value.field == "endpoint"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{", "is not valid JSON"),
        ('["https://api.openai.com/v1"]', "must be a JSON object"),
        ('{"Bad Name": {"base_url": "https://x.example"}}', "endpoint names must match"),
        ('{"x": {"base_url": "ftp://x.example"}}', "base_url must be an http"),
        ('{"x": {"base_url": "https://user:pw@x.example/v1"}}', "base_url must be an http"),
        ('{"x": {"base_url": "https://x.example/v1?key=1"}}', "base_url must be an http"),
        ('{"x": {}}', "base_url must be an http"),
        ('{"x": {"base_url": "https://x.example", "credentials": "k"}}', "credentials must be"),
        ('{"x": {"base_url": "https://x.example", "keys": []}}', "must be {base_url, credentials}"),
    ],
)
def test_a_bad_value_fails_at_boot_naming_the_variable(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        LlmEndpoints.from_env({VAR: value})
    assert str(caught.value).startswith(VAR)
    assert "pw@" not in str(caught.value)
