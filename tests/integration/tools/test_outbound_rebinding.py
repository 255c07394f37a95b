"""The outbound guard on a real DNS server and a real HTTP server on loopback: each connection
resolves its host once, is checked on that answer, and connects to an address of it, so a name
that answers a public address to the check and loopback afterwards (DNS rebinding) never
reaches loopback; an IPv6 address embedding a private IPv4 one is judged by that IPv4."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator

import pytest
from conftest import apply_and_start
from dns_server import DnsServer, dns_server, resolve_with
from loopback_http import Answer, Loopback, http_employee, loopback
from psycopg_pool import AsyncConnectionPool
from test_tools import call

from eventos import names
from eventos.db import Conn
from eventos.settings import HttpToolSettings, OutboundSettings, SecretStore
from eventos.tools import http
from eventos.tools.runner import ToolRunner

PUBLIC = "93.184.215.14"  # a global address nothing here listens on
SETTINGS = HttpToolSettings(timeout_s=2, max_response_bytes=64 * 1024, max_body_shown=1024)
STRICT = OutboundSettings(allow_private=False)  # the default an instance runs with


@pytest.fixture
def server() -> Iterator[Loopback]:
    with loopback() as s:
        yield s


@pytest.fixture
def dns() -> Iterator[DnsServer]:
    with dns_server() as d:
        yield d


@pytest.fixture
async def employee(pool: AsyncConnectionPool[Conn]) -> str:
    name = f"r{uuid.uuid4().hex[:8]}"
    await apply_and_start(pool, http_employee(name, "[localhost, orders.test, ipv6.test]"))
    return name


def runner(
    pool: AsyncConnectionPool[Conn], dns: DnsServer, outbound: OutboundSettings
) -> ToolRunner:
    resolver = functools.partial(resolve_with, dns.resolver())
    extras = {http.SETTINGS_KEY: SETTINGS, http.OUTBOUND_KEY: outbound, http.RESOLVER_KEY: resolver}
    return ToolRunner(pool, SecretStore(env={}), extras)


async def test_a_name_rebinding_to_loopback_never_reaches_it(
    pool: AsyncConnectionPool[Conn], employee: str, server: Loopback, dns: DnsServer
) -> None:
    # `localhost` so that any second resolution (the system's, as an HTTP client connecting by
    # name does) lands on the loopback server, as the attacker's second answer would.
    dns.answer("localhost", [PUBLIC], ["127.0.0.1"])
    server.answer("/internal", Answer(body=b'{"secret": "db password"}'))
    port = server.server.server_address[1]
    url = f"http://localhost:{port}/internal"
    result = await runner(pool, dns, STRICT).run(call(employee, {"method": "GET", "url": url}))
    assert result.outcome == names.TOOL_REFUSED, result.content
    assert "could not connect to localhost" in json.loads(result.content)["error"]
    assert server.requests("/internal") == []
    assert dns.queries["localhost/A"] == 1  # one resolution for the one connection
    # The next connection resolves again and gets loopback: refused before connecting.
    again = await runner(pool, dns, STRICT).run(call(employee, {"method": "GET", "url": url}))
    assert "is a private address (127.0.0.1)" in json.loads(again.content)["error"]
    assert server.requests("/internal") == []


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:127.0.0.1",
        "::127.0.0.1",
        "64:ff9b::7f00:1",
        "64:ff9b:1:7f00:0:100::",
        "2002:7f00:1::1",
        "64:ff9b::a9fe:a9fe",
        "2002:a01:203::",
    ],
)
async def test_an_address_embedding_a_private_ipv4_is_refused(
    pool: AsyncConnectionPool[Conn], employee: str, dns: DnsServer, address: str
) -> None:
    dns.answer("ipv6.test", [address])
    url = "http://ipv6.test/latest/meta-data"
    result = await runner(pool, dns, STRICT).run(call(employee, {"method": "GET", "url": url}))
    assert result.outcome == names.TOOL_REFUSED
    assert "ipv6.test is a private address" in json.loads(result.content)["error"]


async def test_the_request_keeps_the_name_it_was_made_for(
    pool: AsyncConnectionPool[Conn], employee: str, server: Loopback, dns: DnsServer
) -> None:
    dns.answer("orders.test", ["127.0.0.1"])
    server.answer("/orders", Answer())
    port = server.server.server_address[1]
    allowed = OutboundSettings(allow_private=True)
    c = call(employee, {"method": "GET", "url": f"http://orders.test:{port}/orders"})
    result = await runner(pool, dns, allowed).run(c)
    assert result.outcome == names.TOOL_OK, result.content
    (seen,) = server.requests("/orders")
    assert seen.headers["Host"] == f"orders.test:{port}"  # connected by address, asked by name
