"""The owner API against its own OpenAPI document: valid, and fuzzed on every operation.

The fuzz runs schemathesis over real HTTP against the in-process ingress on a real database.
Its calls are synchronous, so they run in a thread while the event loop serves them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import schemathesis
from conftest import ADMIN_TOKEN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = 12  # per operation and mode: the whole fuzz stays well under a minute
STREAMS = {"/v1/employees/{name}/chat/events", "/v1/events"}  # never end: refusals tested apart
# No 5xx, and every answer as documented: its status, its content type, its body; and a call
# without the token is refused. (Not "schema-valid data is accepted": the request schemas do
# not restate every rule, e.g. what makes a spec valid.)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, ignored_auth]  # fmt: skip
# The message's framing, which the HTTP client sets from the body: a fuzzed value (seen:
# `transfer-encoding: else`) makes a malformed HTTP message, refused by the server (uvicorn's
# parser: 400, text/plain) before any operation sees it.
FRAMING = {"transfer-encoding", "content-length"}


async def openapi_document(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.get("/openapi.json")
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


async def test_openapi_document_is_valid_and_describes_every_body(ingress_url: str) -> None:
    doc = await openapi_document(ingress_url)
    validate(doc)
    schemas = doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        assert path.startswith("/v1/")
        for method, op in item.items():
            for media in op.get("requestBody", {}).get("content", {}).values():
                assert "$ref" in media["schema"] or media["schema"]["type"] == "string"
            for code, answer in op["responses"].items():
                for media_type, media in answer.get("content", {}).items():
                    target = media["schema"].get("$ref", "").rsplit("/", 1)[-1]
                    streamed = media_type == "text/event-stream"
                    assert target in schemas or streamed, (method, path, code)
            assert {"401", "503"} <= set(op["responses"]), (method, path)


def fuzz(doc: dict[str, Any], url: str, user_token: str) -> list[str]:
    """Every operation, positive and negative, generic and on the started employee, as the
    admin or as a user."""
    schema = schemathesis.openapi.from_dict(doc)
    ran = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path in STREAMS:
            continue
        fixed = [{}]
        if any(p.name == "name" for p in operation.path_parameters):
            fixed.append({"name": "support"})
        strategies = [
            operation.as_strategy(mode, path_parameters=params)
            for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
            for params in fixed
        ]

        @given(case=st.one_of(strategies), token=st.sampled_from([ADMIN_TOKEN, user_token]))
        @settings(max_examples=EXAMPLES * len(strategies), deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def run(case: schemathesis.Case, token: str) -> None:
            for name in FRAMING if case.headers else ():  # a case-insensitive mapping
                case.headers.pop(name, None)
            headers = {"Authorization": f"Bearer {token}"}
            case.call_and_validate(base_url=url, headers=headers, checks=CHECKS, timeout=10)

        run()
        ran.append(f"{operation.method.upper()} {operation.path}")
    return ran


async def test_fuzz_every_operation(started: str, ingress_url: str) -> None:
    doc = await openapi_document(ingress_url)
    async with httpx.AsyncClient(base_url=ingress_url) as c:
        r = await c.post("/v1/users", json={"name": "fuzzer"},
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})  # fmt: skip
    ran = await asyncio.to_thread(fuzz, doc, ingress_url, r.json()["token"])
    assert len(ran) == sum(len(item) for item in doc["paths"].values()) - len(STREAMS)
