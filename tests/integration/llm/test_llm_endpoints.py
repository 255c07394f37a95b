"""`POST /v1/employees` (apply) lets a model call only an endpoint on the operator's list
(EVENTOS_LLM_ENDPOINTS), with a credential that endpoint allows; anything else is a 400 naming
the field path, and nothing is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from conftest import ADMIN_TOKEN

from eventos.llm.endpoints import OPENAI_BASE_URL, Endpoint, LlmEndpoints

VLLM = "http://vllm.models.svc:8000/v1"


@pytest.fixture
def llm_endpoints() -> LlmEndpoints:
    """The operator allows OpenAI with `openai-main` and an in-cluster vLLM without a key."""
    return LlmEndpoints(
        (Endpoint("openai", OPENAI_BASE_URL, ("openai-main",)), Endpoint("vllm", VLLM))
    )


@pytest.fixture
async def api(ingress_url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/yaml"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=10) as c:
        yield c


def spec(*models: str) -> str:
    agents = "\n".join(f"    - {{name: a{i}, model: {m}}}" for i, m in enumerate(models))
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: shop}}
spec:
  agents:
{agents}
  triggers: [{{kind: chat}}]
"""


@pytest.mark.parametrize(
    "model",
    [
        "{provider: openai, endpoint: openai, name: gpt-4.1-mini, credential: openai-main}",
        "{provider: openai, name: gpt-4.1-mini, credential: openai-main}",  # the default URL
        f"{{provider: openai, name: llama3, base_url: '{VLLM}/'}}",
        "{provider: openai, endpoint: vllm, name: llama3}",
        "{provider: local, name: scripted}",
        "{provider: openai, endpoint: vllm, name: my-o3, options: {token_limit_param: max_completion_tokens}}",
        "{provider: openai, endpoint: openai, name: o3, credential: openai-main, "
        "options: {token_limit_param: max_tokens}}",
    ],
)
async def test_a_model_on_the_operators_list_is_applied(api: httpx.AsyncClient, model: str) -> None:
    r = await api.post("/v1/employees", content=spec(model))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("model", "path", "message"),
    [
        (
            "{provider: openai, name: gpt-4.1-mini, credential: openai-main, "
            "base_url: 'https://collector.example/v1'}",
            "spec.agents[1].model.base_url",
            "not an allowed endpoint; allowed: openai, vllm (EVENTOS_LLM_ENDPOINTS)",
        ),
        (
            f"{{provider: openai, endpoint: openai, name: m, credential: openai-main, "
            f"base_url: '{VLLM}'}}",
            "spec.agents[1].model.base_url",
            "not the base_url of endpoint 'openai'",
        ),
        (
            "{provider: openai, endpoint: vllm, name: llama3, credential: openai-main}",
            "spec.agents[1].model.credential",
            "endpoint 'vllm' does not allow credential 'openai-main'",
        ),
        (
            "{provider: openai, endpoint: azure, name: m, credential: openai-main}",
            "spec.agents[1].model.endpoint",
            "no endpoint named 'azure'",
        ),
        (
            "{provider: openai, endpoint: vllm, name: llama3, options: {token_limit_param: max_length}}",
            "spec.agents[1].model.options.token_limit_param",
            "'max_tokens' or 'max_completion_tokens'",
        ),
        (
            "{provider: openai, endpoint: vllm, name: llama3, options: {max_tokens: 100}}",
            "spec.agents[1].model.options.max_tokens",
            "Extra inputs are not permitted",
        ),
    ],
)
async def test_anything_else_is_refused_by_field_path_and_not_stored(
    api: httpx.AsyncClient, model: str, path: str, message: str
) -> None:
    r = await api.post("/v1/employees", content=spec("{provider: local, name: scripted}", model))
    assert r.status_code == 400, r.text
    [error] = r.json()["errors"]
    assert error["path"] == path
    assert message in error["message"]
    assert (await api.get("/v1/employees/shop")).status_code == 404
