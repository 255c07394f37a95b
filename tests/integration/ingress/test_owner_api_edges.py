"""The owner API's edges: problem+json refusals, body caps, hostile JSON, a database outage."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from conftest import ADMIN_TOKEN

from eventos.testing import wait_for
from eventos.testing.plugin import PostgresForTests

PROBLEM = "application/problem+json"
TYPES = "https://eventos.dev/problems/"
CHAT = "/v1/employees/support/chat"


@pytest.fixture
async def api(ingress_url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=20) as c:
        yield c


def problem_of(r: httpx.Response, status: int, kind: str) -> dict[str, object]:
    """The answer is an RFC 9457 problem of this status and type."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    doc = r.json()
    assert doc["type"] == TYPES + kind
    assert doc["status"] == status
    assert isinstance(doc["title"], str) and isinstance(doc["detail"], str)
    assert isinstance(doc, dict)
    return doc


def bad_fields(r: httpx.Response) -> list[str]:
    doc = problem_of(r, 400, "invalid-request")
    errors = doc["errors"]
    assert isinstance(errors, list)
    return [e["path"] for e in errors]


async def test_refusals_are_problems_with_stable_types(
    started: str, api: httpx.AsyncClient, ingress_url: str
) -> None:
    async with httpx.AsyncClient(base_url=ingress_url) as anonymous:
        r = await anonymous.get("/v1/employees")
        problem_of(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        wrong = {"Authorization": "Bearer not-the-token"}
        problem_of(await anonymous.get("/v1/employees", headers=wrong), 401, "unauthorized")
        problem_of(await anonymous.get("/v1/employees", headers={"Authorization": "Basic abc"}),
                   401, "unauthorized")  # fmt: skip
        lower = {"Authorization": f"bearer {ADMIN_TOKEN}"}
        assert (await anonymous.get("/v1/employees", headers=lower)).status_code == 200
    problem_of(await api.get("/v1/nothing-here"), 404, "not-found")
    problem_of(await api.get("/v1"), 404, "not-found")
    r = await api.delete("/v1/employees")
    problem_of(r, 405, "method-not-allowed")
    assert r.headers["allow"] == "GET, HEAD, POST"
    problem_of(await api.get("/v1/employees/nobody"), 404, "not-found")
    problem_of(await api.post("/v1/employees/support:start"), 409, "conflict")
    problem_of(await api.get("/v1/intents/123456789012345678901234567890"), 404, "not-found")
    assert bad_fields(await api.get("/v1/intents/x1")) == ["intent_id"]
    spec = problem_of(await api.post("/v1/employees", json={"kind": "Employee"}), 400,
                      "invalid-spec")  # fmt: skip
    assert {"path": "metadata", "message": "Field required"} in spec["errors"]  # type: ignore[operator]
    # The webhook edge keeps its own plain answers.
    assert (await api.get("/hooks/nothing")).headers["content-type"] != PROBLEM


async def test_bodies_over_the_cap_are_413_before_and_while_reading(
    started: str, api: httpx.AsyncClient
) -> None:
    big = json.dumps({"client_message_id": "m", "text": "x" * (64 * 1024)}).encode()
    problem_of(await api.post(CHAT, content=big), 413, "body-too-large")

    async def streamed(chunks: int, size: int) -> AsyncIterator[bytes]:
        for _ in range(chunks):
            yield b" " * size  # JSON whitespace: only the cap can refuse it

    # No Content-Length (chunked): the read stops at the cap.
    problem_of(await api.post(CHAT, content=streamed(100, 1024)), 413, "body-too-large")
    r = await api.post("/v1/employees/support:stop", content=streamed(65, 1024))
    assert r.status_code == 202  # a body the operation does not read is not refused
    over = b"#" * (1024 * 1024 + 1)
    r = await api.post("/v1/employees", content=over, headers={"content-type": "application/yaml"})
    problem_of(r, 413, "body-too-large")
    # Apply takes up to 1 MiB: a long comment is still a spec.
    spec = (await api.get("/v1/employees/support")).json()["spec"]
    text = "#" * (1000 * 1024) + "\n" + json.dumps(spec)
    r = await api.post("/v1/employees", content=text, headers={"content-type": "application/yaml"})
    assert r.status_code == 200, r.text


async def test_hostile_json_is_400_naming_the_field(started: str, api: httpx.AsyncClient) -> None:
    def chat(raw: str) -> httpx.Request:
        return api.build_request("POST", CHAT, content=raw.encode("utf-8", "surrogatepass"))

    assert bad_fields(await api.send(chat('{"client_message_id": "m", "text": "a\\u0000b"}'))) == [
        "text"
    ]
    lone = '{"client_message_id": "m", "text": "\\ud800"}'
    assert bad_fields(await api.send(chat(lone))) == ["text"]
    assert bad_fields(await api.send(chat('{"client_message_id": "m", "te\\u0000xt": "x"}'))) == [
        "(body)"
    ]
    nested = '{"client_message_id": "m", "text": "x", "x": ' + "[" * 64 + "]" * 64 + "}"
    assert bad_fields(await api.send(chat(nested))) == ["x" + "[0]" * 63]
    deep = "[" * 30_000 + "]" * 30_000  # past the parser's own recursion limit
    assert bad_fields(await api.send(chat(deep))) == ["(body)"]
    for not_an_object in ("[1]", '"text"', "3", "null", "NaN", '{"text": NaN}', "{"):
        assert bad_fields(await api.send(chat(not_an_object))) == ["(body)"], not_an_object
    assert bad_fields(await api.post(CHAT, json={"client_message_id": "m", "text": 5})) == ["text"]
    r = await api.post("/v1/employees/support/limits", json={"daily_usd": -1})
    assert bad_fields(r) == ["daily_usd"]
    r = await api.post("/v1/employees/support:interrupt", json={"conversation": "talk\u0000/x"})
    assert bad_fields(r) == ["conversation"]
    assert bad_fields(await api.get("/v1/employees/a%00b")) == ["name"]
    assert bad_fields(await api.get("/v1/employees/support/chat/events?session=%00")) == ["session"]
    # Specs too: a NUL escaped in YAML, nesting past the limit, an alias bomb.
    spec = (await api.get("/v1/employees/support")).json()["spec"]
    spec["spec"]["agents"][0]["system"] = "a\u0000b"
    r = await api.post("/v1/employees", json=spec)
    assert bad_fields(r) == ["spec.agents[0].system"]
    yaml_nul = 'metadata: {name: "a\\0b"}'
    r = await api.post("/v1/employees", content=yaml_nul, headers={"content-type": "text/yaml"})
    assert bad_fields(r) == ["metadata.name"]
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)
    )
    r = await api.post("/v1/employees", content=bomb, headers={"content-type": "text/yaml"})
    assert bad_fields(r) == ["(body)"]


async def test_page_cursors_past_a_bigint_are_400_naming_the_parameter(
    started: str, api: httpx.AsyncClient
) -> None:
    # 24 digits whose first 19 are in range (the fuzz test's find); 2**63; and 0.
    for before in ["475736754653546869161984", str(2**63), "0"]:
        r = await api.get("/v1/outbox", params={"before": before})
        assert bad_fields(r) == ["before"], before
    assert (await api.get("/v1/outbox", params={"before": str(2**63 - 1)})).status_code == 200


async def test_database_down_is_503_with_retry_after_on_every_operation(
    started: str, api: httpx.AsyncClient, postgres_server: PostgresForTests, db_name: str
) -> None:
    chat = {"client_message_id": "m-1", "text": "hi"}
    calls = [
        ("GET", "/v1/employees", None), ("GET", "/v1/employees/support", None),
        ("POST", "/v1/employees/support:stop", None), ("POST", "/v1/employees/support:start", None),
        ("POST", "/v1/employees/support:interrupt", {}), ("POST", "/v1/rearm", None),
        ("POST", "/v1/employees/support/limits", {"daily_usd": 3}), ("GET", "/v1/intents/1", None),
        ("POST", CHAT, chat), ("GET", f"{CHAT}/1", None), ("GET", f"{CHAT}/events", None),
    ]  # fmt: skip
    with postgres_server.unavailable(db_name):
        answers = await asyncio.gather(
            *(api.request(method, path, json=body) for method, path, body in calls)
        )
        for (method, path, _), r in zip(calls, answers, strict=True):
            problem_of(r, 503, "database-unavailable")
            assert int(r.headers["retry-after"]) > 0, (method, path)
        r = await api.post("/v1/employees", content=json.dumps({"kind": "Employee"}))
        assert r.status_code == 400  # refused before any database work: not an outage
        assert (await api.get("/openapi.json")).status_code == 200

    async def back() -> bool:
        return (await api.get("/v1/employees")).status_code == 200

    await wait_for(back, timeout=20, interval=0.2, what="the owner API after the outage")
