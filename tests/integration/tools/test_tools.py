"""Tool calls on real PostgreSQL and a real HTTP server on loopback: arguments checked against
the schema, the agent's allowed tools and hosts, credentials by reference, and the `unknown`
rule (SPEC §11): an unsafe call that broke off is never made again on its own; a safe one is."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator

import httpx
import pytest
from conftest import PURPOSES, PURPOSES_VAR, apply_and_start
from loopback_http import Answer, Loopback, http_employee, loopback
from psycopg_pool import AsyncConnectionPool
from test_router import query
from test_turns import Instance, instance, transcript  # noqa: F401 (the in-process stack fixture)

from eventos import names
from eventos.contracts import ToolCallInput, TurnInput
from eventos.conversations.turns import load
from eventos.db import Conn
from eventos.settings import HttpToolSettings, OutboundSettings, SecretStore
from eventos.testing import wait_for
from eventos.tools import http
from eventos.tools.runner import ToolRunner

SECRETS = SecretStore(env={PURPOSES_VAR: PURPOSES, "EVENTOS_SECRET_ORDERS_API": "orders-token-123"})
LOOPBACK_OK = OutboundSettings(allow_private=True)  # the test's servers are on loopback
SETTINGS = HttpToolSettings(timeout_s=5, max_response_bytes=64 * 1024, max_body_shown=1024)


@pytest.fixture
def server() -> Iterator[Loopback]:
    with loopback() as s:
        yield s


@pytest.fixture
async def employee(pool: AsyncConnectionPool[Conn]) -> str:
    name = f"h{uuid.uuid4().hex[:8]}"
    hosts = (
        "[{host: 127.0.0.1, auth: {scheme: bearer, secret: orders-api}}, 10.1.2.3, "
        "169.254.169.254, '*.example.org']"
    )
    await apply_and_start(pool, http_employee(name, hosts))
    return name


def call(employee: str, args: dict[str, object] | str, name: str = "http_request",
         call_id: str | None = None) -> ToolCallInput:  # fmt: skip
    text = args if isinstance(args, str) else json.dumps(args)
    turn = f"turn-conv-{employee}-g1-talk-main-1"
    return ToolCallInput(employee, 1, "front", "main", "talk", f"{employee}/g1/talk/main", turn,
                         call_id or f"call_{uuid.uuid4().hex[:12]}", name, text, 1,
                         {"kind": "chat"}, "chain-1", 0)  # fmt: skip


def runner(pool: AsyncConnectionPool[Conn]) -> ToolRunner:
    return ToolRunner(pool, SECRETS, {http.SETTINGS_KEY: SETTINGS, http.OUTBOUND_KEY: LOOPBACK_OK})


async def row(pool: AsyncConnectionPool[Conn], key: str) -> dict[str, object]:
    (found,) = await query(pool, f"SELECT * FROM tool_calls WHERE id = '{key}'")
    return found


async def test_a_get_reads_the_answer_with_the_hosts_credential(
    pool: AsyncConnectionPool[Conn], employee: str, server: Loopback
) -> None:
    server.answer("/orders", Answer(body=b'{"orders": [1, 2]}'))
    c = call(employee, {"method": "GET", "url": f"{server.base_url}/orders?open=1"})
    result = await runner(pool).run(c)
    assert result.outcome == names.TOOL_OK
    out = json.loads(result.content)
    assert out["status"] == 200 and json.loads(out["body"]) == {"orders": [1, 2]}
    assert out["headers"]["content-type"] == "application/json"
    (seen,) = server.requests("/orders")
    assert seen.headers["Authorization"] == "Bearer orders-token-123"  # by reference only
    stored = await row(pool, c.key)
    assert (stored["effect"], stored["status"], stored["outcome"]) == ("read_only", "done", "ok")
    assert "orders-token-123" not in json.dumps(stored, default=str)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"method": "GET", "url": "http://evil.test/x"}, "host 'evil.test' is not allowed"),
        ({"method": "FETCH", "url": "http://127.0.0.1/"}, "invalid arguments at method"),
        ({"method": "GET"}, "'url' is a required property"),
        ({"method": "GET", "url": "ftp://127.0.0.1/"}, "absolute http or https URL"),
        ({"method": "GET", "url": "http://u:p@127.0.0.1/"}, "must not carry credentials"),
        (
            {"method": "GET", "url": "http://127.0.0.1/", "headers": {"Authorization": "x"}},
            "set by the tool",
        ),
        (
            {"method": "GET", "url": "http://127.0.0.1/", "headers": {"X-A": "a\r\nB: c"}},
            "line break",
        ),
        ('{"method": ', "arguments are not JSON"),
        ("[1]", "must be a JSON object"),
        ({"method": "POST", "url": "http://127.0.0.1/", "body": "x" * 40_000}, "arguments over"),
    ],
)
async def test_bad_calls_go_back_to_the_model_as_refusals(
    pool: AsyncConnectionPool[Conn], employee: str, args: dict[str, object] | str, fragment: str
) -> None:
    result = await runner(pool).run(call(employee, args))
    assert result.outcome == names.TOOL_REFUSED
    assert fragment in json.loads(result.content)["error"]


async def test_a_tool_the_agent_does_not_have_is_not_available(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    for tool in ("teleport", "set_alarm"):
        result = await runner(pool).run(call(employee, {}, name=tool))
        assert result.outcome == names.TOOL_REFUSED
        assert json.loads(result.content) == {"error": f"tool {tool!r} is not available"}
    assert await query(pool, "SELECT 1 FROM tool_calls") == []


async def test_an_unsafe_call_that_broke_off_is_unknown_and_never_repeated(
    pool: AsyncConnectionPool[Conn], employee: str, server: Loopback
) -> None:
    server.answer("/pay", Answer(body=b'{"paid": true, "pad": "' + b"x" * 4000 + b'"}', cut=True))
    c = call(employee, {"method": "POST", "url": f"{server.base_url}/pay", "body": {"eur": 5}})
    with pytest.raises(httpx.RemoteProtocolError):
        await runner(pool).run(c)  # the attempt breaks off: Temporal retries the activity
    for _ in range(2):  # the retries: unknown, not a second payment
        result = await runner(pool).run(c)
        assert result.outcome == names.TOOL_UNKNOWN
        assert "will not be repeated" in json.loads(result.content)["error"]
    assert len(server.requests("/pay")) == 1
    stored = await row(pool, c.key)
    assert (stored["effect"], stored["status"], stored["attempts"]) == ("unsafe", "unknown", 3)
    (item,) = await query(pool, "SELECT kind, ref, action, state, count FROM attention_items")
    assert item == {"kind": "tool_unknown", "ref": c.key, "action": "retry", "state": "open",
                    "count": 1}  # fmt: skip


@pytest.mark.parametrize(
    ("method", "headers", "effect"),
    [("GET", {}, "read_only"), ("PUT", {"Idempotency-Key": "order-7"}, "idempotent")],
)
async def test_a_call_safe_to_repeat_runs_again_after_breaking_off(
    pool: AsyncConnectionPool[Conn], employee: str, server: Loopback, method: str,
    headers: dict[str, str], effect: str,
) -> None:  # fmt: skip
    server.answer("/flaky", Answer(body=b'{"n": "' + b"y" * 4000 + b'"}', cut=True))
    c = call(employee, {"method": method, "url": f"{server.base_url}/flaky", "headers": headers})
    with pytest.raises(httpx.RemoteProtocolError):
        await runner(pool).run(c)
    server.answer("/flaky", Answer(body=b'{"n": 1}'))
    result = await runner(pool).run(c)
    assert result.outcome == names.TOOL_OK and json.loads(json.loads(result.content)["body"]) == {
        "n": 1
    }
    again = await runner(pool).run(c)  # a retry after it finished reads the stored result
    assert again == result
    seen = server.requests("/flaky")
    assert len(seen) == 2 and all(s.method == method for s in seen)
    if headers:
        assert all(s.headers["Idempotency-Key"] == "order-7" for s in seen)
    stored = await row(pool, c.key)
    assert (stored["effect"], stored["status"], stored["attempts"]) == (effect, "done", 3)
    assert await query(pool, "SELECT 1 FROM attention_items") == []


async def test_what_could_not_connect_was_not_sent_and_is_a_refusal(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = call(employee, {"method": "POST", "url": f"http://127.0.0.1:{port}/x"})
    result = await runner(pool).run(c)
    assert result.outcome == names.TOOL_REFUSED
    assert "nothing was sent" in json.loads(result.content)["error"]


async def test_redirects_are_shown_not_followed_and_big_answers_are_cut(
    pool: AsyncConnectionPool[Conn], employee: str, server: Loopback
) -> None:
    server.answer("/moved", Answer(302, b"", {"Location": "http://evil.test/steal"}))
    server.answer("/big", Answer(body=b"z" * (200 * 1024), headers={"Content-Type": "text/plain"}))
    moved = json.loads((await runner(pool).run(
        call(employee, {"method": "GET", "url": f"{server.base_url}/moved"}))).content)  # fmt: skip
    assert (moved["status"], moved["headers"]["location"]) == (302, "http://evil.test/steal")
    big = json.loads((await runner(pool).run(
        call(employee, {"method": "GET", "url": f"{server.base_url}/big"}))).content)  # fmt: skip
    assert big["truncated"] is True and big["body"] == "z" * SETTINGS.max_body_shown


async def test_a_turn_is_offered_its_agents_tools_with_their_schemas(
    pool: AsyncConnectionPool[Conn], employee: str
) -> None:
    turn = TurnInput("t-1", employee, 1, "front", "main", f"{employee}/g1/talk/main", 1, {}, [])
    async with pool.connection() as conn:
        ctx = await load(conn, turn)
    (tool,) = ctx.tools
    assert tool.name == "http_request" and tool.parameters["required"] == ["method", "url"]
    assert tool.parameters["additionalProperties"] is False


async def test_a_turn_calls_a_tool_and_the_owners_retry_runs_an_unknown_call_again(
    instance: Instance,  # noqa: F811 (the fixture imported above)
    server: Loopback,
) -> None:
    name = f"r{uuid.uuid4().hex[:8]}"
    await apply_and_start(instance.pool, http_employee(name, "[127.0.0.1]"))
    server.answer("/pay", Answer(body=b'{"paid": "' + b"p" * 4000 + b'"}', cut=True))
    args = {"method": "POST", "url": f"{server.base_url}/pay", "body": {"eur": 5}}
    r = await instance.api.post(f"/v1/employees/{name}/chat", json={
        "client_message_id": uuid.uuid4().hex, "text": f"pay\ncall: http_request {json.dumps(args)}"})  # fmt: skip
    reply = await instance.reply(int(r.json()["message_id"]), name=name)
    assert "http_request returned" in reply and "unknown" in reply
    assert len(server.requests("/pay")) == 1
    (item,) = await query(instance.pool, "SELECT id, ref FROM attention_items")

    server.answer("/pay", Answer(body=b'{"paid": true}'))
    act = f"/v1/attention/{item['id']}:act"
    assert (await instance.api.post(act, json={"action": "ack"})).status_code == 400
    asked = await instance.api.post(act, json={"action": "retry"})
    assert asked.status_code == 202, asked.text
    assert asked.json()["call"] == item["ref"]
    again = await instance.api.post(act, json={"action": "retry"})  # asking twice retries once
    assert again.status_code == 409 and "is resolved" in again.json()["detail"]
    assert (await instance.api.post("/v1/attention/999999:act", json={"action": "retry"})
            ).status_code == 404  # fmt: skip

    async def retried() -> list[dict[str, object]] | None:
        rows = await query(instance.pool, "SELECT status, outcome, retry_of, result FROM tool_calls "
                                          "WHERE retry_of IS NOT NULL AND status <> 'calling'")  # fmt: skip
        return rows or None

    (done,) = await wait_for(retried, timeout=30, what="the retried call")
    assert (done["status"], done["outcome"], done["retry_of"]) == ("done", "ok", item["ref"])
    assert len(server.requests("/pay")) == 2  # once on its own, once because the owner asked

    async def told() -> str | None:
        messages = await transcript(instance.pool, employee=name)
        users = [m["content"] for m in messages if m["role"] == "user"]
        return next((u for u in users if "asked to run your http_request call" in u), None)

    text = await wait_for(told, timeout=30, what="the employee told of the retry")
    assert '{\\"paid\\": true}' in text, text  # the server's answer, as the body the tool read


async def test_private_addresses_are_refused_unless_the_operator_allows_them(
    pool: AsyncConnectionPool[Conn], employee: str, server: Loopback
) -> None:
    server.answer("/orders", Answer())
    strict = ToolRunner(pool, SECRETS, {http.SETTINGS_KEY: SETTINGS})  # the default: deny
    for url in (f"{server.base_url}/orders", "http://10.1.2.3/", "http://169.254.169.254/latest"):
        result = await strict.run(call(employee, {"method": "GET", "url": url}))
        assert result.outcome == names.TOOL_REFUSED, url
        assert "is a private address" in json.loads(result.content)["error"]
    assert server.requests("/orders") == []
