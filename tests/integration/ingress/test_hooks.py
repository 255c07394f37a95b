"""POST /hooks/{path}: every row of the answer table of SPEC §6.1, on real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import signing
from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn
from eventos.testing import wait_for
from eventos.testing.plugin import PostgresForTests


@pytest.fixture
async def client(started: str, ingress_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=ingress_url, timeout=10) as c:
        yield c


async def rows(pool: AsyncConnectionPool[Conn], source: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM bus_ingress WHERE source_key = %s ORDER BY id", (source,)
        )
        return await cur.fetchall()


def event_body(**extra: object) -> bytes:
    return json.dumps({"id": f"evt_{uuid.uuid4().hex}", "type": "invoice.paid", **extra}).encode()


async def test_appended_answers_200_after_commit(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    body = event_body()
    r = await client.post("/hooks/stripe", content=body, headers=signing.stripe(body))
    assert r.status_code == 200
    assert r.json()["status"] == "accepted"
    stored = await rows(pool, "webhook:stripe")
    assert [row["id"] for row in stored] == [r.json()["id"]]
    assert stored[0]["status"] == "accepted"
    assert stored[0]["class"] == 3
    assert stored[0]["envelope"]["data"]["body"] == json.loads(body)


async def test_duplicate_answers_200_and_stores_nothing_new(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    body = event_body()
    first = await client.post("/hooks/stripe", content=body, headers=signing.stripe(body))
    again = await client.post("/hooks/stripe", content=body, headers=signing.stripe(body))
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json() == {"status": "duplicate", "id": first.json()["id"]}
    stored = await rows(pool, "webhook:stripe")
    assert len(stored) == 1
    assert stored[0]["dup_count"] == 1


async def test_body_over_cap_by_content_length_is_413(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    r = await client.post("/hooks/small", content=b"x" * 1001, headers={"X-Event-Id": "1"})
    assert r.status_code == 413
    assert await rows(pool, "webhook:small") == []


async def test_body_over_cap_without_content_length_is_413(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"y" * 100

    r = await client.post("/hooks/small", content=chunks(), headers={"X-Event-Id": "2"})
    assert "content-length" not in r.request.headers
    assert r.status_code == 413
    assert await rows(pool, "webhook:small") == []


async def test_body_over_cap_in_raw_chunked_framing_is_413(ingress_url: str, started: str) -> None:
    import asyncio

    host, port = ingress_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b"z" * 2000
    head = (
        b"POST /hooks/small HTTP/1.1\r\nHost: x\r\nX-Event-Id: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    # Chunked framing: the server learns the size only while reading.
    writer.write(head + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert b" 413 " in status


async def test_bad_signature_is_401(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    body = event_body()
    headers = signing.stripe(body)
    r = await client.post("/hooks/stripe", content=body + b" ", headers=headers)
    assert r.status_code == 401
    r = await client.post("/hooks/plain", content=b"{}", headers={"X-Token": "wrong"})
    assert r.status_code == 401
    r = await client.post("/hooks/plain", content=b"{}")
    assert r.status_code == 401
    assert await rows(pool, "webhook:stripe") == []
    assert await rows(pool, "webhook:plain") == []


async def test_empty_path_is_401(client: httpx.AsyncClient) -> None:
    r = await client.post("/hooks/", content=b"{}")
    assert r.status_code == 401


async def test_undeclared_path_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post("/hooks/nobody-declares-this", content=b"{}")
    assert r.status_code == 404


async def test_wrong_method_is_405(client: httpx.AsyncClient) -> None:
    for method in ("GET", "PUT", "DELETE"):
        r = await client.request(method, "/hooks/stripe")
        assert r.status_code == 405
        assert r.headers["allow"] == "POST"


async def test_rate_over_limit_is_429_with_retry_after(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    """Generic webhooks: 10/s with a burst of 20. Rounds of 30 at once outrun the refill however
    slow the machine is (one after another, a slow machine could stay under 10/s)."""
    codes: list[int] = []
    for n in range(20):
        batch = await asyncio.gather(*[
            client.post("/hooks/internal", content=b"{}", headers={"X-Event-Id": f"r{n}-{i}"})
            for i in range(30)
        ])  # fmt: skip
        codes += [r.status_code for r in batch]
        limited = [r for r in batch if r.status_code == 429]
        if limited:
            assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
            break
    assert 429 in codes
    assert set(codes) <= {200, 429}
    assert codes.count(200) >= 20
    assert len(await rows(pool, "webhook:internal")) == codes.count(200)


async def test_backlog_over_high_water_is_429(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            """INSERT INTO bus_ingress (source_key, dedupe_key, type, envelope, size, chain_id)
               SELECT 'webhook:deploys', 'k' || g, 'x', '{}'::jsonb, 2, 'c' || g
               FROM generate_series(1, 1000) g"""
        )

    async def refused() -> httpx.Response | None:
        body = event_body()
        r = await client.post("/hooks/deploys", content=body, headers=signing.deploy(body))
        assert r.status_code in (200, 429)
        return r if r.status_code == 429 else None

    # The backlog is counted off the request path, once a second.
    r = await wait_for(refused, timeout=5, interval=0.2, what="429 over the high water")
    assert "retry-after" in r.headers


async def test_unavailable_secret_is_503(client: httpx.AsyncClient) -> None:
    r = await client.post("/hooks/missing-secret", content=b"{}", headers={"X-T": "x"})
    assert r.status_code == 503
    assert "retry-after" in r.headers


async def test_database_down_is_503_never_200(
    client: httpx.AsyncClient, postgres_server: PostgresForTests, db_name: str,
    pool: AsyncConnectionPool[Conn],
) -> None:  # fmt: skip
    # Resolve once so the endpoint is cached and the failure happens at the append.
    warm = await client.post("/hooks/internal", content=b"{}", headers={"X-Event-Id": "warm"})
    assert warm.status_code == 200
    with postgres_server.unavailable(db_name):
        r = await client.post("/hooks/internal", content=b"{}", headers={"X-Event-Id": "down"})
        assert r.status_code == 503
        assert "retry-after" in r.headers
    await pool.check()  # drop the test's own connections that the outage killed
    stored = await rows(pool, "webhook:internal")
    assert [row["dedupe_key"] for row in stored] == ["h:warm"]


async def test_verified_but_malformed_is_200_and_dead(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    body = b"{not json"
    r = await client.post("/hooks/stripe", content=body, headers=signing.stripe(body))
    assert r.status_code == 200
    (row,) = await rows(pool, "webhook:stripe")
    assert (row["status"], row["error"]) == ("dead", "malformed: not JSON")


async def test_owner_api_needs_the_bearer_token(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/employees")
    assert r.status_code == 401
    r = await client.get("/v1/employees", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"})
    assert r.status_code == 401


async def test_clock_is_what_verification_uses(client: httpx.AsyncClient) -> None:
    body = event_body()
    stale = signing.stripe(body, ts=int(time.time()) - 3600)
    r = await client.post("/hooks/stripe", content=body, headers=stale)
    assert r.status_code == 401
    assert "tolerance" in r.json()["error"]
