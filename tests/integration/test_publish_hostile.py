"""Hostile callers of gRPC EventIngress on a real port against real PostgreSQL (SPEC §6.3,
I3, I8): who may publish what, poison that must not stall a stream, and every bound.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
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
from eventos_ingress.publish import driver_chain_id
from prometheus_client import REGISTRY
from psycopg_pool import AsyncConnectionPool

from eventos import employees
from eventos.db import Conn, connect
from eventos.driver import Backoff, DriverClient, DriverOutbox
from eventos.errors import ConfigError
from eventos.service import Service
from eventos.settings import (
    AdminSettings,
    DatabaseSettings,
    GrpcIngressSettings,
    SecretStore,
    ServiceSettings,
)
from eventos.testing import wait_for
from eventos.v1 import ingress_pb2, ingress_pb2_grpc

SOURCE = "grpc:drv-1"
CALL_S = 20.0
ACCEPTED, DUPLICATE, REJECTED = (
    ingress_pb2.Ack.ACCEPTED,
    ingress_pb2.Ack.DUPLICATE,
    ingress_pb2.Ack.REJECTED,
)
COURIER = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: courier}
spec:
  agents:
    - {name: main, model: {provider: local, name: scripted}}
  triggers:
    - {kind: grpc, driver: drv-2, token: courier-driver}
"""


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def envelope(key: str, **extra: Any) -> bytes:
    doc = {"specversion": "1.0", "id": key, "source": "/drivers/x", "type": "message"}
    return json.dumps({**doc, **extra}).encode()


def event(seq: int, key: str, **fields: Any) -> Any:
    values: dict[str, Any] = {
        "driver_id": "drv-1",
        "seq": seq,
        "source_key": SOURCE,
        "dedupe_key": key,
        "type": "message",
        "envelope": envelope(key, data={"text": key}),
    }
    values.update(fields)
    return ingress_pb2.DriverEvent(**values)


async def publish(target: str, events: list[Any], token: str = DRIVER_TOKEN) -> list[Any]:
    async with grpc.aio.insecure_channel(target) as channel:
        call = ingress_pb2_grpc.EventIngressStub(channel).Publish(
            iter(events), timeout=CALL_S, metadata=bearer(token)
        )
        return [ack async for ack in call]


async def append(target: str, ev: Any, token: str) -> Any:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = ingress_pb2_grpc.EventIngressStub(channel)
        return await stub.Append(ev, timeout=CALL_S, metadata=bearer(token))


async def stored(conn: Conn, key: str) -> list[dict[str, Any]]:
    """The ingress and dedupe rows of a dedupe key, from any source."""
    cur = await conn.execute(
        "SELECT 'ingress' AS t, source_key, hop, chain_id, causation_id FROM bus_ingress "
        "WHERE dedupe_key = %(k)s UNION ALL SELECT 'dedupe', source_key, NULL, NULL, NULL "
        "FROM bus_dedupe WHERE dedupe_key = %(k)s",
        {"k": key},
    )
    return await cur.fetchall()


def gauge(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


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
            blob_dir=tmp_path / "blobs",
            grpc=GrpcIngressSettings(internal_token=INTERNAL_TOKEN, **settings),
        )
        service = await build(cfg)
        running.append((service, await run_service(service)))
        return f"127.0.0.1:{service.bound_grpc_port}"

    yield start
    for service, task in running:
        service.stop()
        await asyncio.wait_for(task, 15)


# --- who may publish what ---------------------------------------------------------------

FORGED = {
    "webhook": (DRIVER_TOKEN, "drv-1", "webhook:stripe", "source not publishable"),
    "chat": (DRIVER_TOKEN, "drv-1", "chat:support", "source not publishable"),
    "internal-source": (DRIVER_TOKEN, "drv-1", "internal:x", "source not publishable"),
    "another-drivers-source": (
        DRIVER_TOKEN,
        "drv-1",
        "grpc:drv-2",
        "driver 'drv-1' may not publish source 'grpc:drv-2'",
    ),
    "claims-another-driver-id": (
        DRIVER_TOKEN,
        "drv-2",
        "grpc:drv-2",
        "driver_id 'drv-2' is not the authenticated driver 'drv-1'",
    ),
    "valid-token-of-another-driver": (
        COURIER_DRIVER_TOKEN,
        "drv-1",
        SOURCE,
        "driver_id 'drv-1' is not the authenticated driver 'drv-2'",
    ),
    "own-id-foreign-source": (
        COURIER_DRIVER_TOKEN,
        "drv-2",
        SOURCE,
        "driver 'drv-2' may not publish source 'grpc:drv-1'",
    ),
}


@pytest.mark.parametrize("case", list(FORGED))
async def test_a_forged_source_is_rejected_and_leaves_no_row(
    courier: str, ingress_grpc: str, observer: Conn, case: str
) -> None:
    token, driver, source, reason = FORGED[case]
    own = "grpc:drv-2" if token == COURIER_DRIVER_TOKEN else SOURCE
    own_id = own.removeprefix("grpc:")
    forged = event(1, f"forged-{case}", driver_id=driver, source_key=source)
    fine = event(2, f"fine-{case}", driver_id=own_id, source_key=own)

    acks = await publish(ingress_grpc, [forged, fine], token)
    unary = await append(ingress_grpc, event(3, f"forged-{case}-u", driver_id=driver,
                                             source_key=source), token)  # fmt: skip

    assert [(a.seq, a.status) for a in acks] == [(1, REJECTED), (2, ACCEPTED)]
    assert reason in acks[0].reason and reason in unary.reason
    assert unary.status == REJECTED
    assert await stored(observer, f"forged-{case}") == []
    assert await stored(observer, f"forged-{case}-u") == []
    assert [r["source_key"] for r in await stored(observer, f"fine-{case}")] == [own, own]


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        bearer("wrong-token-0123456789"),
        (("authorization", f"Basic {DRIVER_TOKEN}"),),
        (("authorization", "Bearer "),),
    ],
    ids=["none", "wrong", "not-bearer", "empty"],
)
async def test_a_call_without_a_valid_token_is_unauthenticated(
    started: str, ingress_grpc: str, observer: Conn, metadata: Any
) -> None:
    async with grpc.aio.insecure_channel(ingress_grpc) as channel:
        stub = ingress_pb2_grpc.EventIngressStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await stub.Append(event(1, "anon-u"), metadata=metadata, timeout=CALL_S)
        call = stub.Publish(iter([event(1, "anon-s")]), metadata=metadata, timeout=CALL_S)
        with pytest.raises(grpc.aio.AioRpcError) as stream:
            async for _ in call:
                pass

    assert unary.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert stream.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "Bearer" in str(stream.value.details())
    assert await stored(observer, "anon-u") == await stored(observer, "anon-s") == []


async def test_a_retired_drivers_token_stops_authenticating(
    courier: str, ingress_grpc: str, pool: AsyncConnectionPool[Conn]
) -> None:
    ev = event(1, "while-live", driver_id="drv-2", source_key="grpc:drv-2")
    assert (await append(ingress_grpc, ev, COURIER_DRIVER_TOKEN)).status == ACCEPTED
    async with pool.connection() as conn:
        await employees.reset(conn, courier)

    async def refused() -> bool:
        try:
            await append(ingress_grpc, event(2, "after-reset"), COURIER_DRIVER_TOKEN)
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.UNAUTHENTICATED
        return False

    await wait_for(refused, timeout=10, what="the retired driver's token refused")


async def test_a_drivers_hop_chain_and_causation_are_ignored(
    started: str, ingress_grpc: str, observer: Conn
) -> None:
    forged = {"hop": 7, "chain_id": "victim-chain", "causation_id": "victim-event"}
    (ack,) = await publish(ingress_grpc, [event(1, "chain-s", **forged)])
    unary = await append(ingress_grpc, event(2, "chain-u", **forged), DRIVER_TOKEN)

    assert ack.status == unary.status == ACCEPTED
    for key in ("chain-s", "chain-u"):
        row = next(r for r in await stored(observer, key) if r["t"] == "ingress")
        assert (row["hop"], row["causation_id"]) == (0, None)
        assert row["chain_id"] == driver_chain_id(SOURCE, key) != "victim-chain"


async def test_the_internal_token_appends_internal_sources_with_their_chain(
    started: str, ingress_grpc: str, observer: Conn
) -> None:
    carried = {"hop": 3, "chain_id": "chain-42", "causation_id": "ingress-41"}
    ok = [
        await append(
            ingress_grpc,
            event(n, f"internal-{n}", driver_id="alarms", source_key=src, **carried),
            INTERNAL_TOKEN,
        )
        for n, src in enumerate(["internal:tests", "alarm:support/main"], start=1)
    ]
    refused = [
        await append(ingress_grpc, event(9, f"internal-bad-{i}", source_key=src), INTERNAL_TOKEN)
        for i, src in enumerate([SOURCE, "webhook:stripe", "chat:support", "cron:x/y"])
    ]

    assert [a.status for a in ok] == [ACCEPTED, ACCEPTED]
    for n in (1, 2):
        row = next(r for r in await stored(observer, f"internal-{n}") if r["t"] == "ingress")
        assert (row["hop"], row["chain_id"], row["causation_id"]) == (3, "chain-42", "ingress-41")
    for i, a in enumerate(refused):
        assert a.status == REJECTED and "source not publishable" in a.reason, a.reason
        assert await stored(observer, f"internal-bad-{i}") == []


# --- poison never stalls a stream -------------------------------------------------------


def ce(data_json: str) -> bytes:
    head = '{"specversion":"1.0","id":"p","source":"/p","type":"t","data":'
    return (head + data_json + "}").encode()


POISON = {
    "nul-escape": (ce('"a\\u0000b"'), "envelope holds a NUL character"),
    "lone-surrogate": (ce('"\\ud800"'), "envelope holds a lone surrogate"),
    "deeper-than-64": (ce("[" * 65 + "]" * 65), "envelope nested deeper than 64"),
    "20000-deep": (ce("[" * 20_000 + "]" * 20_000), "envelope nested deeper than 64"),
    # Python reads NaN; PostgreSQL's jsonb refuses it: bus.append_isolated rejects it alone.
    "refused-by-postgres": (ce('{"x": NaN}'), "unstorable (22P02)"),
}


@pytest.mark.parametrize("case", list(POISON))
async def test_poison_is_rejected_alone_and_the_stream_goes_on(
    started: str, ingress_grpc: str, observer: Conn, case: str
) -> None:
    poison, reason = POISON[case]
    keys = [f"{case}-ok-1", f"{case}-bad-1", f"{case}-bad-2", f"{case}-ok-2"]
    events = [
        event(1, keys[0]),
        event(2, keys[1], envelope=poison),
        event(3, keys[2], envelope=poison),
        event(4, keys[3]),
    ]

    acks = await publish(ingress_grpc, events)

    assert [(a.seq, a.status) for a in acks] == [
        (1, ACCEPTED), (2, REJECTED), (3, REJECTED), (4, ACCEPTED)
    ]  # fmt: skip
    assert acks[1].reason == acks[2].reason == reason
    assert len(await stored(observer, keys[0])) == len(await stored(observer, keys[3])) == 2
    assert await stored(observer, keys[1]) == await stored(observer, keys[2]) == []


FIELDS = {
    "driver_id": ({"driver_id": "d" * 300}, "driver_id is 300 bytes, over 256"),
    "source_key": ({"source_key": "grpc:" + "s" * 300}, "source_key is 305 bytes, over 256"),
    "type": ({"type": "t" * 257}, "type is 257 bytes, over 256"),
    "body_ref": ({"body_ref": "b" * 300}, "body_ref is 300 bytes, over 256"),
    "dedupe_key": ({"dedupe_key": "k" * 9000}, "dedupe_key is 9000 bytes, over 8192"),
    "nul-in-type": ({"type": "a\x00b"}, "type holds a NUL character"),
    "missing-type": ({"type": ""}, "driver_id, source_key, dedupe_key and type are required"),
}


@pytest.mark.parametrize("case", list(FIELDS))
async def test_string_fields_are_bounded(
    started: str, ingress_grpc: str, observer: Conn, case: str
) -> None:
    fields, reason = FIELDS[case]
    bad = event(2, f"field-{case}", **fields)
    acks = await publish(ingress_grpc, [event(1, f"field-ok-{case}"), bad])

    assert [(a.status, a.reason) for a in acks] == [(ACCEPTED, ""), (REJECTED, reason)]
    cur = await observer.execute("SELECT count(*) AS n FROM bus_ingress WHERE source_key = %s "
                                 "AND dedupe_key LIKE 'field-%%' AND dedupe_key <> %s",
                                 (SOURCE, f"field-ok-{case}"))  # fmt: skip
    assert await cur.fetchone() == {"n": 0}


async def test_a_long_dedupe_key_under_the_bound_is_stored_hashed_and_dedupes(
    started: str, ingress_grpc: str
) -> None:
    key = "long-" + "k" * 4000
    acks = await publish(ingress_grpc, [event(1, key), event(2, key)])
    assert [a.status for a in acks] == [ACCEPTED, DUPLICATE]


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
    events = [event(n, f"burst-{n}", envelope=envelope(f"b{n}", data="x" * 4000))
              for n in range(1, 1001)]  # fmt: skip
    acks = await publish(ingress_grpc, events)
    assert [(a.seq, a.status) for a in acks] == [(n, ACCEPTED) for n in range(1, 1001)]


async def lock_waits(conn: Conn) -> int:
    cur = await conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


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


async def open_stream(target: str, release: asyncio.Event) -> tuple[Any, Any]:
    """A Publish stream that stays open until `release` is set; (channel, call)."""

    async def requests() -> AsyncIterator[Any]:
        await release.wait()
        return
        yield

    channel = grpc.aio.insecure_channel(target)
    stub = ingress_pb2_grpc.EventIngressStub(channel)
    return channel, stub.Publish(requests(), timeout=CALL_S, metadata=bearer(DRIVER_TOKEN))


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
            lambda: asyncio.sleep(0, gauge("eventos_publish_streams") - before == 2),
            what="two streams open",
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await publish(target, [event(1, f"over-{limit}")])
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
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
        blob_dir=tmp_path / "blobs",
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
            lambda: asyncio.sleep(0, gauge("eventos_publish_streams") - before == 1),
            what="the stream open",
        )
        assert opened
        proxy.frozen.set()
        await wait_for(
            lambda: asyncio.sleep(0, gauge("eventos_publish_streams") == before),
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
            lambda: asyncio.sleep(0, gauge("eventos_publish_streams") - before == 2),
            what="two streams of drv-1 open",
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await publish(target, [event(1, "third-of-drv-1")])
        other = event(1, "while-drv-1-is-full", driver_id="drv-2", source_key="grpc:drv-2")
        (ack,) = await publish(target, [other], COURIER_DRIVER_TOKEN)
    finally:
        release.set()
        for channel, call in held:
            assert [a async for a in call] == []
            await channel.close()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "drv-1" in str(refused.value.details())
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
            lambda: asyncio.sleep(0, gauge("eventos_publish_streams") - before == 1),
            what="the stream open",
        )
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(call.read(), 15)
        assert gauge("eventos_publish_streams") == before
        assert ended.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    finally:
        release.set()
        await channel.close()


async def test_a_message_that_does_not_parse_ends_only_its_own_call(
    started: str, ingress_grpc: str
) -> None:
    not_utf8 = b"\x0a\x02\xff\xfe"  # DriverEvent.driver_id = two bytes that are not UTF-8
    async with grpc.aio.insecure_channel(ingress_grpc) as channel:
        raw = channel.stream_stream(
            "/eventos.v1.EventIngress/Publish",
            request_serializer=lambda b: b,
            response_deserializer=ingress_pb2.Ack.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as broken:
            async for _ in raw(iter([not_utf8]), metadata=bearer(DRIVER_TOKEN), timeout=CALL_S):
                pass
        unary = channel.unary_unary(
            "/eventos.v1.EventIngress/Append",
            request_serializer=lambda b: b,
            response_deserializer=ingress_pb2.Ack.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as unary_broken:
            await unary(not_utf8, metadata=bearer(DRIVER_TOKEN), timeout=CALL_S)
    assert broken.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "could not be read" in str(broken.value.details())
    assert unary_broken.value.code() == grpc.StatusCode.UNKNOWN  # gRPC's own answer
    (ack,) = await publish(ingress_grpc, [event(1, "after-unparseable")])
    assert ack.status == ACCEPTED
