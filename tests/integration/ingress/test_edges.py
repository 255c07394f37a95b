"""Edges that cannot be starved (issue 25 point 6), on the real ingress over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from conftest import ADMIN_TOKEN, SECRETS, apply_and_start, ingress_config, run_service
from eventos_ingress.app import IngressConfig, build
from psycopg_pool import AsyncConnectionPool
from test_turns import local_spec

from eventos.db import Conn
from eventos.runtime.service import Service
from eventos.settings import DatabaseSettings, HttpBounds, SecretStore
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
                    streams_max_in_flight=2, keep_alive_s=6)  # fmt: skip


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


async def test_an_idle_connection_is_kept_for_the_keep_alive_setting(edges: Service) -> None:
    """The server closes an idle kept-alive connection after `keep_alive_s`, not before (it
    was uvicorn's 5 s, the same as httpx's own idle expiry: both ends let go at once, and a
    request sent on a connection being closed failed with a read error)."""
    port = edges.bound_http_port
    assert port is not None
    sent = time.monotonic()
    answer = await exchange(port, b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")  # until it closes
    kept = time.monotonic() - sent
    assert status(answer) == 200
    # A timer never fires early; 6 s is past uvicorn's own 5 s, so the setting is what held it.
    assert kept >= BOUNDS.keep_alive_s, kept
    assert HttpBounds().keep_alive_s > httpx.Limits().keepalive_expiry  # type: ignore[operator]


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
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Event-Id: trickle-{path}\r\n"
        f"Content-Type: application/json\r\nConnection: close\r\n"
        f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: {total}\r\n\r\n"
    )
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
    db_settings: DatabaseSettings, tmp_path: Path, bounds: HttpBounds,
    cfg: IngressConfig | None = None,
) -> AsyncIterator[Service]:  # fmt: skip
    cfg = cfg or ingress_config(db_settings, tmp_path)
    service = await build(replace(cfg, http_bounds=bounds))
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


class WatchedSecrets(dict[str, str]):
    """The secret store's environment, noting every name the store looks up."""

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        self.asked: list[str] = []

    def __contains__(self, key: object) -> bool:
        self.asked.append(str(key))
        return super().__contains__(key)


INTERACTION_HEADERS = {"X-Signature-Ed25519": "00" * 64, "X-Signature-Timestamp": "1",
                       "Content-Type": "application/json"}  # fmt: skip


async def test_the_discord_endpoint_tells_no_secret_names(
    db_settings: DatabaseSettings, tmp_path: Path, pool: AsyncConnectionPool[Conn],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A secret's name that is not a read Discord account and a name nothing has are the same
    404, and the secret store is never asked; an account that is read but whose secret is not
    a Discord credential is 503, logged once however often it is called."""
    name = f"d{uuid.uuid4().hex[:8]}"
    watched = WatchedSecrets({**SECRETS, f"EVENTOS_SECRET_DC_{name.upper()}": "not a credential"})
    await apply_and_start(pool, local_spec(name, f"    - {{kind: discord, account: dc-{name}}}\n"))
    cfg = ingress_config(db_settings, tmp_path, secrets=SecretStore(env=watched))
    caplog.set_level(logging.INFO)
    async with (
        ingress_with(db_settings, tmp_path, HttpBounds(), cfg) as service,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.bound_http_port}") as client,
    ):
        answers = []
        for account in ("github-hook", "stripe-whsec", "no-such-name"):
            r = await client.post(f"/channels/discord/{account}", content=b'{"type": 1}',
                                  headers=INTERACTION_HEADERS)  # fmt: skip
            answers.append((r.status_code, r.content))
        assert answers == [(404, b'{"error":"unknown account"}')] * 3
        looked_up = [k for k in watched.asked if "GITHUB" in k or "STRIPE" in k or "SUCH" in k]
        assert looked_up == []
        for _ in range(3):
            r = await client.post(f"/channels/discord/dc-{name}", content=b'{"type": 1}',
                                  headers=INTERACTION_HEADERS)  # fmt: skip
            assert r.status_code == 503 and r.headers["retry-after"]
    told = [r for r in caplog.records
            if r.name == "eventos_ingress.discord" and r.levelno >= logging.WARNING]  # fmt: skip
    assert len(told) == 1 and f"dc-{name}" in told[0].getMessage()
