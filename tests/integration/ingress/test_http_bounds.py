"""Bounded HTTP (SPEC I3): every bound answers its code, and real traffic passes untouched."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from conftest import ingress_config, run_service
from eventos_ingress.app import build

from eventos.runtime.service import Service
from eventos.settings import DatabaseSettings, HttpBounds, IngressBuffers

BOUNDS = HttpBounds(max_header_bytes=8 * 1024, header_timeout_s=1.0, body_idle_timeout_s=1.0,
                    max_in_flight=3, max_connections=64, hooks_max_in_flight=3)  # fmt: skip
DEADLINE_S = 10.0


@pytest.fixture
async def bounded(
    started: str, db_settings: DatabaseSettings, tmp_path: Path
) -> AsyncIterator[Service]:
    cfg = ingress_config(db_settings, tmp_path, http_bounds=BOUNDS)
    service = await build(cfg)
    task = await run_service(service)
    yield service
    service.stop()
    await asyncio.wait_for(task, 15)


async def exchange(port: int, *parts: bytes) -> bytes:
    """Send `parts`, then read the answer until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
        return await asyncio.wait_for(reader.read(), DEADLINE_S)
    finally:
        writer.close()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_headers_past_the_bound_are_431_as_they_arrive(bounded: Service) -> None:
    start = b"POST /hooks/internal HTTP/1.1\r\nHost: x\r\nX-Event-Id: 1\r\n"
    filler = [b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(2000)]  # 2 MB of headers
    reader, writer = await asyncio.open_connection("127.0.0.1", bounded.bound_http_port)
    received = bytearray()

    async def read() -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                received.extend(chunk)

    reading = asyncio.create_task(read())
    writer.write(start)
    with contextlib.suppress(ConnectionError):
        for line in filler:
            writer.write(line)
            await writer.drain()
            if received:
                break  # answered before we were done sending
    await asyncio.wait_for(reading, DEADLINE_S)
    writer.close()
    assert status(bytes(received)) == 431


async def test_headers_not_complete_in_time_are_408(bounded: Service) -> None:
    started = time.monotonic()
    answer = await exchange(bounded.bound_http_port, b"POST /hooks/internal HTTP/1.1\r\nHo")
    assert status(answer) == 408
    assert time.monotonic() - started < DEADLINE_S


async def test_a_connection_that_sends_nothing_is_closed_without_an_answer(
    bounded: Service,
) -> None:
    started = time.monotonic()
    assert await exchange(bounded.bound_http_port) == b""
    assert time.monotonic() - started < DEADLINE_S


async def test_a_stalled_body_is_408_and_stores_nothing(bounded: Service, pool: object) -> None:
    head = (b"POST /hooks/internal HTTP/1.1\r\nHost: x\r\nX-Event-Id: s1\r\n"
            b"Content-Length: 100\r\n\r\n")  # fmt: skip
    answer = await exchange(bounded.bound_http_port, head, b'{"a": 1')
    assert status(answer) == 408


async def test_a_body_that_keeps_arriving_is_not_stalled(bounded: Service) -> None:
    """The idle bound is between parts, not on the whole body: each part comes well within
    it, the whole body takes longer than it."""
    parts = [b'{"a": ', b'"', b"x" * 10, b'"', b"}"]
    head = (b"POST /hooks/internal HTTP/1.1\r\nHost: x\r\nX-Event-Id: trickle\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n") % len(b"".join(parts))  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", bounded.bound_http_port)
    try:
        started = time.monotonic()
        writer.write(head)
        for part in parts:
            # The server says nothing (no 408) for a third of the idle bound: then the next part.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1), BOUNDS.body_idle_timeout_s / 3)
            writer.write(part)
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(), DEADLINE_S)
    finally:
        writer.close()
    assert time.monotonic() - started > BOUNDS.body_idle_timeout_s
    assert status(answer) == 200


async def test_requests_past_the_in_flight_cap_are_503_with_retry_after(
    bounded: Service,
) -> None:
    port = bounded.bound_http_port
    head = (b"POST /hooks/big HTTP/1.1\r\nHost: x\r\nX-Event-Id: slow\r\n"
            b"Content-Length: 1000\r\n\r\n")  # fmt: skip
    slow = []
    for _ in range(BOUNDS.max_in_flight):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + b"{")
        await writer.drain()
        slow.append((reader, writer))
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
        deadline = time.monotonic() + DEADLINE_S
        while True:  # the slow uploads are in flight once their headers are parsed
            r = await client.post("/hooks/internal", content=b"{}", headers={"X-Event-Id": "n"})
            if r.status_code == 503 or time.monotonic() > deadline:
                break
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert (await client.get("/livez")).status_code == 200  # probes are never refused
        for _, writer in slow:
            writer.close()
        deadline = time.monotonic() + DEADLINE_S
        while r.status_code == 503 and time.monotonic() < deadline:
            r = await client.post("/hooks/internal", content=b"{}", headers={"X-Event-Id": "n2"})
        assert r.status_code == 200


async def test_ordinary_requests_pass_untouched(bounded: Service) -> None:
    url = f"http://127.0.0.1:{bounded.bound_http_port}"
    headers = {"X-Event-Id": "ok", "User-Agent": "u" * 2000, "X-Request-Id": "r" * 1000}
    async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
        r = await client.post("/hooks/big", content=b"{" + b'"k": "' + b"v" * 900_000 + b'"}',
                              headers={**headers, "content-type": "application/json"})  # fmt: skip
        assert r.status_code == 200, r.text
        again = await client.post("/hooks/internal", content=b"{}", headers=headers)
        assert again.status_code == 200


def test_every_bound_is_a_setting() -> None:
    env = {"EVENTOS_HTTP_MAX_HEADER_BYTES": "4096", "EVENTOS_HTTP_HEADER_TIMEOUT_S": "2.5",
           "EVENTOS_HTTP_BODY_IDLE_TIMEOUT_S": "7", "EVENTOS_HTTP_MAX_IN_FLIGHT": "9",
           "EVENTOS_HTTP_MAX_CONNECTIONS": "99", "EVENTOS_HTTP_BODY_TIMEOUT_S": "60",
           "EVENTOS_HTTP_BODY_MIN_RATE": "512", "EVENTOS_HTTP_BODY_RATE_GRACE_S": "5",
           "EVENTOS_HTTP_HOOKS_MAX_IN_FLIGHT": "7", "EVENTOS_HTTP_STREAMS_MAX_IN_FLIGHT": "8",
           "EVENTOS_HTTP_KEEP_ALIVE_S": "30"}  # fmt: skip
    assert HttpBounds.from_env(env) == HttpBounds(
        max_header_bytes=4096, header_timeout_s=2.5, keep_alive_s=30, body_idle_timeout_s=7.0,
        max_in_flight=9, max_connections=99, body_timeout_s=60.0, body_min_rate=512,
        body_rate_grace_s=5.0, hooks_max_in_flight=7, streams_max_in_flight=8,
    )  # fmt: skip
    assert set(env) == {f"EVENTOS_HTTP_{name.upper()}" for name in HttpBounds().__dict__}
    assert HttpBounds.from_env({}) == HttpBounds()
    from eventos.errors import ConfigError

    for bad in ("0", "-1", "many"):
        with pytest.raises(ConfigError, match="EVENTOS_HTTP_MAX_IN_FLIGHT"):
            HttpBounds.from_env({"EVENTOS_HTTP_MAX_IN_FLIGHT": bad})
    buffers = {"EVENTOS_INGRESS_SPOOL_DIR": "/x", "EVENTOS_INGRESS_COMMIT_QUEUE_MAX": "9"}
    assert IngressBuffers.from_env(buffers) == IngressBuffers(Path("/x"), 9)
    assert IngressBuffers.from_env({}) == IngressBuffers(None, 4096)
    with pytest.raises(ConfigError, match="EVENTOS_INGRESS_COMMIT_QUEUE_MAX"):
        IngressBuffers.from_env({"EVENTOS_INGRESS_COMMIT_QUEUE_MAX": "0"})
