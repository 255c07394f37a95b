"""`POST /v1/employees` (apply) refuses a secret reference outside the purpose its operator
declared (EVENTOS_SECRETS_PURPOSES), naming the field; nothing is stored. A credential on a
wildcard host needs a secret declared for that wildcard (its explicit scope)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from conftest import ADMIN_TOKEN, ingress_config, run_service

from eventos.llm.endpoints import OPENAI_BASE_URL, Endpoint, LlmEndpoints
from eventos.runtime.service import Service
from eventos.secret_purposes import VAR as PURPOSES_VAR
from eventos.settings import DatabaseSettings, SecretStore

# The operator's declarations this instance runs with.
PURPOSES = (
    "openai-main=llm stripe-whsec=webhook tg-*=channel courier=driver "
    "orders-api=http:api.orders.test orders-any=http:*.orders.test feed-token=poll:feed.orders.test"
)


@pytest.fixture
async def ingress(db_settings: DatabaseSettings, tmp_path: Path) -> AsyncIterator[Service]:
    """Ingress with the operator's map above; the official endpoint takes any `llm` secret."""
    endpoints = LlmEndpoints((Endpoint("openai", OPENAI_BASE_URL, ("*",)),))
    secrets = SecretStore(env={PURPOSES_VAR: PURPOSES})
    service = await build_ingress(db_settings, tmp_path, endpoints, secrets)
    task = await run_service(service)
    yield service
    service.stop()
    await asyncio.wait_for(task, 15)


async def build_ingress(db_settings: DatabaseSettings, tmp_path: Path, endpoints: LlmEndpoints,
                        secrets: SecretStore) -> Service:  # fmt: skip
    from eventos_ingress.app import build

    return await build(ingress_config(db_settings, tmp_path, llm_endpoints=endpoints,
                                      secrets=secrets))  # fmt: skip


@pytest.fixture
async def api(ingress: Service) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/yaml"}
    url = f"http://127.0.0.1:{ingress.bound_http_port}"
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as c:
        yield c


def spec(agent: str = "", trigger: str = "") -> str:
    """An employee with a plain agent and a chat trigger, then `agent` and `trigger`."""
    agents = "    - {name: a0, model: {provider: local, name: scripted}}\n" + (
        f"    - {agent}\n" if agent else ""
    )
    triggers = "    - {kind: chat}\n" + (f"    - {trigger}\n" if trigger else "")
    return (f"apiVersion: eventos/v1\nkind: Employee\nmetadata: {{name: shop}}\nspec:\n"
            f"  agents:\n{agents}  triggers:\n{triggers}")  # fmt: skip


TOOL_AGENT = "{{name: a1, model: {{provider: local, name: scripted}}, tools: [http_request], " \
             "http_hosts: [news.test, {{host: '{host}', auth: {{scheme: bearer, secret: {ref}}}}}]}}"  # fmt: skip
POLL = ("{{kind: poll, interval_s: 60, url: '{url}', items_path: items, "
        "auth: {{scheme: bearer, secret: {ref}}}}}")  # fmt: skip
MODEL = "{{name: a1, model: {{provider: openai, name: gpt-4.1-mini, credential: {ref}}}}}"


@pytest.mark.parametrize(
    ("agent", "trigger", "path", "message"),
    [
        (MODEL.format(ref="stripe-whsec"), "", "spec.agents[1].model.credential",
         "secret 'stripe-whsec' is declared for 'webhook', not 'llm'"),
        (TOOL_AGENT.format(host="api.orders.test", ref="openai-main"), "",
         "spec.agents[1].http_hosts[1].auth",
         "secret 'openai-main' is declared for 'llm', not 'http:api.orders.test'"),
        (TOOL_AGENT.format(host="collector.evil.test", ref="orders-api"), "",
         "spec.agents[1].http_hosts[1].auth",
         "declared for 'http:api.orders.test', not 'http:collector.evil.test'"),
        # A wildcard entry sends to every subdomain: a secret scoped to one host is not enough.
        (TOOL_AGENT.format(host="*.orders.test", ref="orders-api"), "",
         "spec.agents[1].http_hosts[1].auth",
         "declared for 'http:api.orders.test', not 'http:*.orders.test'"),
        ("", POLL.format(url="https://feed.orders.test/items", ref="orders-api"),
         "spec.triggers[1].auth", "declared for 'http:api.orders.test', not 'poll:feed.orders.test'"),
        ("", POLL.format(url="https://evil.test/items", ref="feed-token"),
         "spec.triggers[1].auth", "declared for 'poll:feed.orders.test', not 'poll:evil.test'"),
        ("", "{kind: grpc, driver: courier, token: openai-main}", "spec.triggers[1].token",
         "secret 'openai-main' is declared for 'llm', not 'driver'"),
        ("", "{kind: telegram, account: openai-main}", "spec.triggers[1].account",
         "secret 'openai-main' is declared for 'llm', not 'channel'"),
        ("", "{kind: webhook, path: pay, verify: {scheme: stripe, secret: tg-shop}}",
         "spec.triggers[1].verify.secret", "secret 'tg-shop' is declared for 'channel', not 'webhook'"),
        ("", "{kind: webhook, path: pay, verify: {scheme: stripe, secret: stray}}",
         "spec.triggers[1].verify.secret", "secret 'stray' has no declared purpose"),
    ],
)  # fmt: skip
async def test_a_reference_outside_its_purpose_is_refused_by_field_path_and_not_stored(
    api: httpx.AsyncClient, agent: str, trigger: str, path: str, message: str
) -> None:
    r = await api.post("/v1/employees", content=spec(agent, trigger))
    assert r.status_code == 400, r.text
    [error] = r.json()["errors"]
    assert error["path"] == path
    assert message in error["message"]
    assert (await api.get("/v1/employees/shop")).status_code == 404


@pytest.mark.parametrize(
    ("agent", "trigger"),
    [
        (MODEL.format(ref="openai-main"), ""),
        (TOOL_AGENT.format(host="api.orders.test", ref="orders-api"), ""),
        (TOOL_AGENT.format(host="*.orders.test", ref="orders-any"), ""),  # the explicit scope
        ("", POLL.format(url="https://feed.orders.test/items?x=1", ref="feed-token")),
        ("", "{kind: grpc, driver: courier, token: courier}"),
        ("", "{kind: grpc, driver: drv-9}"),  # its default reference driver-drv-9 is a driver's
        ("", "{kind: telegram, account: tg-shop}"),
        ("", "{kind: webhook, path: pay, verify: {scheme: stripe, secret: stripe-whsec}}"),
    ],
)
async def test_a_reference_within_its_purpose_is_applied(
    api: httpx.AsyncClient, agent: str, trigger: str
) -> None:
    r = await api.post("/v1/employees", content=spec(agent, trigger))
    assert r.status_code == 200, r.text


async def test_the_default_model_endpoint_takes_no_credential(
    db_settings: DatabaseSettings, tmp_path: Path
) -> None:
    """EVENTOS_LLM_ENDPOINTS unset: the official endpoint, but no key goes there on a spec's
    word, even one declared for `llm`."""
    secrets = SecretStore(env={PURPOSES_VAR: PURPOSES})
    service = await build_ingress(db_settings, tmp_path, LlmEndpoints(), secrets)
    task = await run_service(service)
    try:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/yaml"}
        url = f"http://127.0.0.1:{service.bound_http_port}"
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as api:
            r = await api.post("/v1/employees", content=spec(MODEL.format(ref="openai-main")))
        assert r.status_code == 400, r.text
        [error] = r.json()["errors"]
        assert error["path"] == "spec.agents[1].model.credential"
        assert "endpoint 'openai' does not allow credential 'openai-main'" in error["message"]
    finally:
        service.stop()
        await asyncio.wait_for(task, 15)
