"""Every bound of the gRPC EventIngress answers its code (I3), the defaults let real traffic
through, and the transport: TLS, plaintext refused off loopback, dead and idle peers dropped.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import (
    COURIER_DRIVER_TOKEN,
    DRIVER_TOKEN,
    INTERNAL_TOKEN,
    SECRETS,
    apply_and_start,
    run_service,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from eventos_ingress.app import IngressConfig, build
from grpc_calls import (
    ACCEPTED,
    CALL_S,
    COURIER,
    REJECTED,
    SOURCE,
    append,
    bearer,
    envelope,
    event,
    gauge,
    lock_waits,
    open_stream,
    publish,
    publish_refused,
    stored,
)
from psycopg_pool import AsyncConnectionPool

from eventos.bus.driver import Backoff, DriverClient, DriverOutbox
from eventos.db import Conn, connect
from eventos.errors import ConfigError
from eventos.runtime.service import Service
from eventos.settings import (
    AdminSettings,
    DatabaseSettings,
    GrpcIngressSettings,
    IngressBuffers,
    SecretStore,
    ServiceSettings,
)
from eventos.testing import wait_for
from eventos.v1 import ingress_pb2_grpc


@pytest.fixture
async def observer(db_settings: DatabaseSettings) -> AsyncIterator[Conn]:
    conn = await connect(db_settings, autocommit=True)
    async with conn:
        yield conn


@pytest.fixture
async def courier(pool: AsyncConnectionPool[Conn], started: str, ingress_grpc: str) -> str:
    """A second driver, drv-2, declared after the ingress runs (its token is looked up in the
    database on first use) with an explicit token reference."""
    await apply_and_start(pool, COURIER)
    return "courier"


@pytest.fixture
async def ingress_with(
    db_settings: DatabaseSettings, tmp_path: Path, started: str
) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Starts an ingress with the given GrpcIngressSettings; its gRPC address."""
    running: list[tuple[Service, asyncio.Task[None]]] = []

    async def start(**settings: Any) -> str:
        cfg = IngressConfig(
            database=db_settings,
            service=ServiceSettings("ingress", http_port=0, grpc_port=0),
            admin=AdminSettings("test-admin-token-hostile-0123"),
            secrets=SecretStore(env=SECRETS),
            buffers=IngressBuffers(tmp_path / "spool"),
            grpc=GrpcIngressSettings(internal_token=INTERNAL_TOKEN, **settings),
        )
        service = await build(cfg)
        running.append((service, await run_service(service)))
        return f"127.0.0.1:{service.bound_grpc_port}"

    yield start
    for service, task in running:
        service.stop()
        await asyncio.wait_for(task, 15)


# --- bounds ------------------------------------------------------------------------------


async def test_a_message_over_the_limit_ends_the_call_with_resource_exhausted(
    started: str, ingress_grpc: str, observer: Conn
) -> None:
    huge = event(2, "huge", envelope=envelope("huge", data="x" * 100_000))
    over_64_kb = event(1, "over-64kb", envelope=envelope("o", data="x" * 70_000))

    (ack,) = await publish(ingress_grpc, [over_64_kb])
    assert ack.status == REJECTED and "over 64 KB" in ack.reason
    with pytest.raises(grpc.aio.AioRpcError) as stream:
        await publish(ingress_grpc, [huge])
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await append(ingress_grpc, huge, DRIVER_TOKEN)

    assert stream.value.code() == unary.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await stored(observer, "huge") == []


async def test_a_1000_event_burst_passes_the_default_bounds(
    started: str, ingress_grpc: str
) -> None:
    # Over twice the read-ahead bytes in all, so part of the burst is paced by acks.
    events = [event(n, f"burst-{n}", envelope=envelope(f"b{n}", data="x" * 9000))
              for n in range(1, 1001)]  # fmt: skip
    assert sum(ev.ByteSize() for ev in events) > 2 * GrpcIngressSettings().read_ahead_bytes
    acks = await publish(ingress_grpc, events)
    assert [(a.seq, a.status) for a in acks] == [(n, ACCEPTED) for n in range(1, 1001)]


@pytest.mark.parametrize("bound", ["bytes", "events"])
async def test_publish_read_ahead_is_bounded_while_appends_wait(
    ingress_with: Callable[..., Awaitable[str]], observer: Conn, bound: str
) -> None:
    limits = {"bytes": {"read_ahead_bytes": 64 * 1024}, "events": {"read_ahead_events": 5}}
    target = await ingress_with(**limits[bound])
    events = [event(n, f"ahead-{bound}-{n}", envelope=envelope(f"a{n}", data="x" * 8000))
              for n in range(1, 41)]  # fmt: skip
    size = events[0].ByteSize()
    bytes0, events0 = (
        gauge("eventos_publish_read_ahead_bytes"),
        gauge("eventos_publish_read_ahead_events"),
    )

    async with observer.transaction():
        await observer.execute("LOCK TABLE bus_dedupe IN SHARE ROW EXCLUSIVE MODE")
        task = asyncio.create_task(publish(target, events))

        async def full() -> bool:
            held_bytes = gauge("eventos_publish_read_ahead_bytes") - bytes0
            held = gauge("eventos_publish_read_ahead_events") - events0
            room = 64 * 1024 - held_bytes < size if bound == "bytes" else held == 5
            return room and await lock_waits(observer) > 0

        await wait_for(full, timeout=15, what=f"read-ahead full by {bound}")
        assert gauge("eventos_publish_read_ahead_bytes") - bytes0 <= (
            64 * 1024 if bound == "bytes" else 5 * size
        )
        assert gauge("eventos_publish_read_ahead_events") - events0 <= (
            64 * 1024 // size if bound == "bytes" else 5
        )
    acks = await asyncio.wait_for(task, CALL_S)
    assert [a.status for a in acks] == [ACCEPTED] * 40
    assert gauge("eventos_publish_read_ahead_bytes") == bytes0


@pytest.mark.parametrize("limit", ["streams", "rpcs"])
async def test_calls_beyond_the_stream_or_rpc_limit_are_resource_exhausted(
    ingress_with: Callable[..., Awaitable[str]], limit: str
) -> None:
    settings = {"max_streams": 2} if limit == "streams" else {"max_concurrent_rpcs": 2}
    target = await ingress_with(**settings)
    release = asyncio.Event()
    before = gauge("eventos_publish_streams")
    held = [await open_stream(target, release) for _ in range(2)]
    try:
        await wait_for(
            streams_at(before + 2),
            what="two streams open",
        )
        code, _ = await publish_refused(target)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        release.set()
        for channel, call in held:
            assert [a async for a in call] == []
            await channel.close()
    # Once the held streams ended, a stream is served again.
    (ack,) = await publish(target, [event(1, f"after-{limit}")])
    assert ack.status == ACCEPTED


async def test_an_idle_connection_is_closed_by_the_server(
    ingress_with: Callable[..., Awaitable[str]],
) -> None:
    target = await ingress_with(max_connection_idle_s=0.5)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = ingress_pb2_grpc.EventIngressStub(channel)
        ack = await stub.Append(event(1, "idle"), timeout=CALL_S, metadata=bearer(DRIVER_TOKEN))
        assert ack.status == ACCEPTED
        assert channel.get_state() == grpc.ChannelConnectivity.READY

        async def idle() -> bool:
            return channel.get_state() == grpc.ChannelConnectivity.IDLE

        await wait_for(idle, timeout=10, what="the server closed the idle connection")


# --- TLS ---------------------------------------------------------------------------------


def streams_at(count: float) -> Callable[[], Awaitable[bool]]:
    """A wait_for condition: the open-streams gauge reads `count`."""

    async def reached() -> bool:
        return gauge("eventos_publish_streams") == count

    return reached


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "eventos-test-ingress")])
    now = datetime.datetime.now(datetime.UTC)
    alt = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(alt, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


async def test_a_driver_publishes_over_tls_with_its_token(
    ingress_with: Callable[..., Awaitable[str]], tmp_path: Path, observer: Conn
) -> None:
    cert_file, key_file = self_signed(tmp_path)
    env = {
        "EVENTOS_INGRESS_GRPC_TLS_CERT_FILE": str(cert_file),
        "EVENTOS_INGRESS_GRPC_TLS_KEY_FILE": str(key_file),
    }
    tls = GrpcIngressSettings.from_env(env)
    target = await ingress_with(tls_cert=tls.tls_cert, tls_key=tls.tls_key)
    outbox = DriverOutbox(tmp_path / "tls-outbox.sqlite")
    try:
        client = DriverClient(target, "drv-1", outbox, 60.0, ack_timeout_s=10.0,
                              token=DRIVER_TOKEN, root_certificates=cert_file.read_bytes(),
                              backoff=Backoff(initial_s=0.05, max_s=0.5))  # fmt: skip
        async with client:
            seq = await client.enqueue(SOURCE, "over-tls", "message", envelope("over-tls"))
            await client.wait_acked(seq, timeout=30)
        assert outbox.pending_count() == 0 and outbox.rejected() == []
    finally:
        outbox.close()
    assert sorted(r["t"] for r in await stored(observer, "over-tls")) == ["dedupe", "ingress"]

    # Plaintext against the TLS port never gets an answer.
    with pytest.raises(grpc.aio.AioRpcError) as plain:
        await publish(target, [event(1, "plaintext")])
    assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await stored(observer, "plaintext") == []


async def test_the_ingress_refuses_to_boot_serving_plaintext_off_loopback(
    db_settings: DatabaseSettings, tmp_path: Path
) -> None:
    cfg = IngressConfig(
        database=db_settings,
        service=ServiceSettings("ingress", host="0.0.0.0", http_port=0, grpc_port=0),
        admin=AdminSettings("test-admin-token-hostile-0123"),
        secrets=SecretStore(env=SECRETS),
        buffers=IngressBuffers(tmp_path / "spool"),
    )
    with pytest.raises(ConfigError, match="EVENTOS_INGRESS_GRPC_INSECURE=true"):
        await build(cfg)


class FreezableProxy:
    """A TCP proxy in front of the ingress that can go silent both ways: a peer that died
    without closing its connection (a pulled cable, a crashed NAT)."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.frozen = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while chunk := await src.read(65536):
            if self.frozen.is_set():
                await asyncio.Event().wait()  # swallow everything from now on
            dst.write(chunk)
            await dst.drain()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        for task in (self._pipe(reader, up_writer), self._pipe(up_reader, writer)):
            t = asyncio.create_task(task)
            self.tasks.add(t)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            self.server.close()


async def test_a_dead_peers_stream_is_dropped_by_keepalive(
    ingress_with: Callable[..., Awaitable[str]],
) -> None:
    target = await ingress_with(keepalive_time_s=1, keepalive_timeout_s=1)
    proxy = FreezableProxy(target)
    via = await proxy.start()
    release = asyncio.Event()
    before = gauge("eventos_publish_streams")
    channel, call = await open_stream(via, release)
    try:
        opened = await wait_for(
            streams_at(before + 1),
            what="the stream open",
        )
        assert opened
        proxy.frozen.set()
        await wait_for(
            streams_at(before),
            timeout=15,
            what="the server dropped the dead peer's stream",
        )
    finally:
        call.cancel()
        await channel.close()
        await proxy.stop()


async def test_one_driver_cannot_take_every_stream(
    ingress_with: Callable[..., Awaitable[str]], courier: str
) -> None:
    target = await ingress_with(max_streams_per_driver=2)
    release = asyncio.Event()
    before = gauge("eventos_publish_streams")
    held = [await open_stream(target, release) for _ in range(2)]
    try:
        await wait_for(
            streams_at(before + 2),
            what="two streams of drv-1 open",
        )
        code, details = await publish_refused(target)
        other = event(1, "while-drv-1-is-full", driver_id="drv-2", source_key="grpc:drv-2")
        (ack,) = await publish(target, [other], COURIER_DRIVER_TOKEN)
    finally:
        release.set()
        for channel, call in held:
            assert [a async for a in call] == []
            await channel.close()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "drv-1" in details
    assert ack.status == ACCEPTED


async def test_a_connection_past_its_maximum_age_is_closed(
    ingress_with: Callable[..., Awaitable[str]],
) -> None:
    target = await ingress_with(max_connection_age_s=1, max_connection_age_grace_s=0.5)
    release = asyncio.Event()
    before = gauge("eventos_publish_streams")
    channel, call = await open_stream(target, release)
    try:
        await wait_for(
            streams_at(before + 1),
            what="the stream open",
        )
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(call.read(), 15)
        assert gauge("eventos_publish_streams") == before
        assert ended.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    finally:
        release.set()
        await channel.close()
