"""Edges that cannot be starved (issue 25 point 6), on the real ingress over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from conftest import ADMIN_TOKEN, ingress_config, run_service
from eventos_ingress.app import build

from eventos.runtime.service import Service
from eventos.settings import DatabaseSettings, HttpBounds
from eventos.testing import ConditionTimeout, wait_for

DEADLINE_S = 10.0

FRAMINGS = {
    "5,000 zeros": (b"Content-Length: " + b"0" * 5000 + b"\r\n", 400),
    "leading zero": (b"Content-Length: 02\r\n", 400),
    "plus sign": (b"Content-Length: +2\r\n", 400),
    "minus sign": (b"Content-Length: -2\r\n", 400),
    "not digits": (b"Content-Length: 2x\r\n", 400),
    "hex": (b"Content-Length: 0x2\r\n", 400),
    "empty": (b"Content-Length: \r\n", 400),
    "space inside": (b"Content-Length: 1 2\r\n", 400),
    "a list": (b"Content-Length: 2, 2\r\n", 400),
    "two equal": (b"Content-Length: 2\r\nContent-Length: 2\r\n", 400),
    "two different": (b"Content-Length: 2\r\nContent-Length: 3\r\n", 400),
    "length and chunked": (b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", 400),
    "unknown coding": (b"Transfer-Encoding: gzip\r\n", 400),
    "chunked twice": (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", 400),
    "30 digits": (b"Content-Length: " + b"9" * 30 + b"\r\n", 400),  # llhttp: overflow
    "19 digits": (b"Content-Length: " + b"1" + b"0" * 18 + b"\r\n", 413),
    "5,000 digits": (b"Content-Length: " + b"9" * 5000 + b"\r\n", 400),
}


# Short body bounds so a test waits seconds; the in-flight caps small so slow senders fill one.
BOUNDS = HttpBounds(body_idle_timeout_s=2.0, body_timeout_s=3.0, body_min_rate=1,
                    body_rate_grace_s=1.0, max_in_flight=4, hooks_max_in_flight=3,
                    streams_max_in_flight=2)  # fmt: skip


@pytest.fixture
async def edges(
    started: str, db_settings: DatabaseSettings, tmp_path: Path
) -> AsyncIterator[Service]:
    cfg = ingress_config(db_settings, tmp_path, http_bounds=BOUNDS)
    service = await build(cfg)
    task = await run_service(service)
    yield service
    service.stop()
    await asyncio.wait_for(task, 15)


async def exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), DEADLINE_S)
    finally:
        writer.close()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_malformed_framing_is_a_4xx_never_a_5xx(edges: Service) -> None:
    """Every odd framing is refused with 400 (413 for a length no body could have), on a
    webhook, the owner API and the Discord interactions endpoint alike."""
    answers = {}
    for path in ("/hooks/internal", "/v1/employees", "/channels/discord/x"):
        for case, (framing, _) in FRAMINGS.items():
            head = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Event-Id: f\r\n"
                    b"Authorization: Bearer " + ADMIN_TOKEN.encode() +
                    b"\r\nConnection: close\r\n")  # fmt: skip
            answer = await exchange(edges.bound_http_port, head + framing + b"\r\n{}")
            answers[path, case] = status(answer)
    expected = {(path, case): code for path, _ in answers for case, (_, code) in FRAMINGS.items()}
    assert answers == expected


async def trickle(port: int, path: str, total: int, every_s: float) -> tuple[int, int]:
    """Send a `total`-byte JSON body one byte every `every_s` (well within the idle bound),
    until answered: the answer's status and how many body bytes were sent by then."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Event-Id: trickle-{path}\r\n"
            f"Content-Type: application/json\r\nConnection: close\r\n"
            f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: {total}\r\n\r\n")
    body = b"[" + b" " * (total - 2) + b"]"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    try:
        writer.write(head.encode())
        while sent < total:
            try:
                first = await asyncio.wait_for(reader.read(64), every_s)
            except TimeoutError:
                writer.write(body[sent : sent + 1])
                sent += 1
                continue
            rest = await asyncio.wait_for(reader.read(), DEADLINE_S)
            return status(first + rest), sent
        raise AssertionError("the whole trickled body was sent and nothing cut it")
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["/hooks/internal", "/v1/employees"])
async def test_a_trickled_body_is_cut_at_its_deadline(edges: Service, path: str) -> None:
    """A byte every 0.2 s never trips the 2 s idle bound, but the body would take 40 s: it is
    cut by the total deadline with 408 (5 bytes a second is over the minimum rate here)."""
    code, sent = await trickle(edges.bound_http_port, path, 200, 0.2)
    assert code == 408
    assert sent < 200


async def test_a_body_under_the_minimum_rate_is_cut_before_its_deadline(
    db_settings: DatabaseSettings, tmp_path: Path, started: str
) -> None:
    """With a long total deadline, the rate alone cuts a body trickled at 5 bytes a second
    (20 are asked for after the first second)."""
    bounds = replace(BOUNDS, body_timeout_s=600.0, body_idle_timeout_s=600.0, body_min_rate=20)
    service = await build(ingress_config(db_settings, tmp_path, http_bounds=bounds))
    task = await run_service(service)
    try:
        code, sent = await trickle(service.bound_http_port, "/hooks/internal", 400, 0.2)
    finally:
        service.stop()
        await asyncio.wait_for(task, 15)
    assert code == 408
    assert sent < 400


@contextlib.asynccontextmanager
async def ingress_with(
    db_settings: DatabaseSettings, tmp_path: Path, bounds: HttpBounds
) -> AsyncIterator[Service]:
    service = await build(ingress_config(db_settings, tmp_path, http_bounds=bounds))
    task = await run_service(service)
    try:
        yield service
    finally:
        service.stop()
        await asyncio.wait_for(task, 15)


async def test_slow_webhook_senders_fill_only_their_own_cap(
    db_settings: DatabaseSettings, tmp_path: Path, started: str
) -> None:
    """Slow senders are added until webhooks answer 503: the owner API and an event stream
    still answer; then streams fill theirs, and the owner API still answers."""
    patient = replace(BOUNDS, body_timeout_s=600.0, body_idle_timeout_s=600.0,
                      body_rate_grace_s=600.0)  # fmt: skip
    async with ingress_with(db_settings, tmp_path, patient) as service:
        port = service.bound_http_port
        url = f"http://127.0.0.1:{port}"
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        head = (b"POST /hooks/big HTTP/1.1\r\nHost: x\r\nX-Event-Id: slow\r\n"
                b"Content-Length: 1000\r\n\r\n{")  # fmt: skip
        held: list[asyncio.StreamWriter] = []
        async with contextlib.AsyncExitStack() as exits:
            client = await exits.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=DEADLINE_S)
            )
            hook = None
            while len(held) < 50:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                exits.callback(writer.close)
                writer.write(head)
                await writer.drain()
                held.append(writer)

                async def refused() -> httpx.Response | None:
                    r = await client.post("/hooks/internal", content=b"{}",
                                          headers={"X-Event-Id": f"n{len(held)}"})  # fmt: skip
                    return r if r.status_code == 503 else None

                with contextlib.suppress(ConditionTimeout):
                    hook = await wait_for(refused, timeout=1.0, interval=0.05, what="503")
                    break
            assert hook is not None and hook.status_code == 503  # webhooks are at their cap
            assert (await client.get("/v1/employees", headers=auth)).status_code == 200
            streams = []
            for _ in range(BOUNDS.streams_max_in_flight):
                stream = await exits.enter_async_context(
                    client.stream("GET", "/v1/events", headers=auth)
                )
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                streams.append(stream)
            one_more = await client.get("/v1/events", headers=auth)
            assert one_more.status_code == 503  # streams are at theirs
            assert (await client.get("/v1/employees", headers=auth)).status_code == 200
