"""gRPC EventIngress against real PostgreSQL (SPEC §6.3): acks after commit, dedupe,
rejections, and the driver client's resend across an ingress restart and a database outage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from conftest import DRIVER_TOKEN, SECRETS
from eventos_ingress.app import IngressConfig, build
from psycopg import sql

from eventos.bus import blobs
from eventos.bus.driver import Backoff, DriverClient, DriverOutbox
from eventos.db import Conn, connect
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
from eventos.testing.plugin import PostgresForTests
from eventos.v1 import ingress_pb2, ingress_pb2_grpc

SOURCE = "grpc:drv-1"
DRIVER = "drv-1"
CALL_DEADLINE_S = 20.0
AUTH = (("authorization", f"Bearer {DRIVER_TOKEN}"),)
ACCEPTED, DUPLICATE, REJECTED = (
    ingress_pb2.Ack.ACCEPTED,
    ingress_pb2.Ack.DUPLICATE,
    ingress_pb2.Ack.REJECTED,
)


def envelope(key: str, **extra: Any) -> bytes:
    doc = {"specversion": "1.0", "id": key, "source": "/drivers/drv-1", "type": "message"}
    return json.dumps({**doc, **extra}).encode()


def driver_event(seq: int, key: str, **fields: Any) -> Any:
    values: dict[str, Any] = {
        "driver_id": DRIVER,
        "seq": seq,
        "source_key": SOURCE,
        "dedupe_key": key,
        "type": "message",
        "envelope": envelope(key, data={"subject": "s1", "text": key}),
    }
    values.update(fields)
    return ingress_pb2.DriverEvent(**values)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def publish(target: str, events: list[Any], token: str = DRIVER_TOKEN) -> list[Any]:
    """Send `events` on one Publish stream with `token`; the acks, in the order received."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = ingress_pb2_grpc.EventIngressStub(channel).Publish(
            iter(events), timeout=CALL_DEADLINE_S, metadata=bearer(token)
        )
        return [ack async for ack in call]


async def rows_for(conn: Conn, key: str) -> list[dict[str, Any]]:
    cur = await conn.execute(
        "SELECT id, dup_count FROM bus_ingress WHERE source_key = %s AND dedupe_key = %s",
        (SOURCE, key),
    )
    return await cur.fetchall()


async def rows_per_key(db: DatabaseSettings) -> dict[str, int]:
    conn = await connect(db, autocommit=True)
    async with conn:
        cur = await conn.execute(
            "SELECT dedupe_key, count(*) AS n FROM bus_ingress WHERE source_key = %s "
            "GROUP BY dedupe_key",
            (SOURCE,),
        )
        return {row["dedupe_key"]: row["n"] for row in await cur.fetchall()}


def _async(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def condition() -> bool:
        return check()

    return condition


@pytest.fixture
async def observer(db_settings: DatabaseSettings) -> AsyncIterator[Conn]:
    """A connection of its own, in autocommit: it sees only what has committed."""
    conn = await connect(db_settings, autocommit=True)
    async with conn:
        yield conn


# --- (a) acks only after commit ---------------------------------------------------------


async def test_each_accepted_ack_arrives_after_its_row_is_committed(
    started: str, ingress_grpc: str, observer: Conn
) -> None:
    events = [driver_event(seq, f"commit-{seq}") for seq in range(1, 401)]

    async with grpc.aio.insecure_channel(ingress_grpc) as channel:
        stub = ingress_pb2_grpc.EventIngressStub(channel)
        call = stub.Publish(iter(events), timeout=CALL_DEADLINE_S, metadata=AUTH)
        seqs = []
        async for ack in call:
            assert ack.status == ACCEPTED, ack.reason
            cur = await observer.execute(
                "SELECT 1 FROM bus_ingress WHERE id = %s", (ack.ingress_id,)
            )
            assert await cur.fetchone() is not None, f"seq {ack.seq} acked before its commit"
            seqs.append(ack.seq)

    assert seqs == list(range(1, 401))


# --- (b) duplicates --------------------------------------------------------------------


async def test_a_resent_source_and_dedupe_key_is_acked_duplicate(
    started: str, ingress_grpc: str, observer: Conn
) -> None:
    first = await publish(ingress_grpc, [driver_event(1, "dup"), driver_event(2, "dup")])
    again = await publish(ingress_grpc, [driver_event(7, "dup", type="other")])

    assert [(a.seq, a.status) for a in first] == [(1, ACCEPTED), (2, DUPLICATE)]
    assert [(a.seq, a.status) for a in again] == [(7, DUPLICATE)]
    assert first[0].ingress_id == first[1].ingress_id == again[0].ingress_id
    assert await rows_for(observer, "dup") == [{"id": first[0].ingress_id, "dup_count": 2}]


# --- (c) rejections --------------------------------------------------------------------

BIG = "x" * (64 * 1024)
REJECTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "not-json": ({"envelope": b"{not json"}, "envelope is not JSON"),
    "missing-attributes": (
        {"envelope": json.dumps({"specversion": "1.0", "id": "a"}).encode()},
        "lacks CloudEvents attributes: source, type",
    ),
    "wrong-specversion": (
        {"envelope": envelope("v", specversion="0.3")},
        "specversion must be 1.0",
    ),
    "over-64-kb": ({"envelope": envelope("big", data=BIG)}, "over 64 KB"),
    "unknown-body-ref": ({"envelope": b"", "body_ref": "blob_nowhere"}, "unknown body_ref"),
    "unknown-source": (
        {"source_key": "grpc:nobody"},
        "driver 'drv-1' may not publish source 'grpc:nobody'",
    ),
    "no-dedupe-key": ({"dedupe_key": ""}, "dedupe_key and type are required"),
}


@pytest.mark.parametrize("case", list(REJECTIONS))
async def test_an_invalid_event_is_rejected_with_a_reason_and_not_stored(
    started: str, ingress_grpc: str, observer: Conn, case: str
) -> None:
    fields, reason = REJECTIONS[case]
    bad = driver_event(2, f"bad-{case}", **fields)
    events = [driver_event(1, f"before-{case}"), bad, driver_event(3, f"after-{case}")]

    acks = await publish(ingress_grpc, events)

    assert [(a.seq, a.status) for a in acks] == [(1, ACCEPTED), (2, REJECTED), (3, ACCEPTED)]
    assert reason in acks[1].reason
    assert acks[1].ingress_id == 0
    cur = await observer.execute(
        "SELECT count(*) AS n FROM bus_ingress WHERE dedupe_key = %s", (bad.dedupe_key,)
    )
    assert (await cur.fetchone()) == {"n": 0}
    cur = await observer.execute(
        "SELECT count(*) AS n FROM bus_dedupe WHERE dedupe_key = %s", (bad.dedupe_key,)
    )
    assert (await cur.fetchone()) == {"n": 0}


async def test_an_event_with_a_known_body_ref_is_accepted(
    started: str, ingress_grpc: str, observer: Conn, tmp_path: Path
) -> None:
    ref = await blobs.store(observer, b"x" * 100_000)
    preview = envelope("by-ref", data={"preview": "xxxx", "body_ref": ref})

    (ack,) = await publish(
        ingress_grpc, [driver_event(1, "by-ref", envelope=preview, body_ref=ref)]
    )

    assert ack.status == ACCEPTED, ack.reason
    cur = await observer.execute(
        "SELECT body_ref FROM bus_ingress WHERE id = %s", (ack.ingress_id,)
    )
    assert await cur.fetchone() == {"body_ref": ref}


# --- (d) unary Append ------------------------------------------------------------------


async def test_append_answers_one_event_after_commit(
    started: str, ingress_grpc: str, observer: Conn
) -> None:
    async with grpc.aio.insecure_channel(ingress_grpc) as channel:
        stub = ingress_pb2_grpc.EventIngressStub(channel)
        first = await stub.Append(driver_event(11, "unary"), timeout=CALL_DEADLINE_S, metadata=AUTH)
        assert first.status == ACCEPTED and first.seq == 11, first.reason
        assert await rows_for(observer, "unary") == [{"id": first.ingress_id, "dup_count": 0}]

        again = await stub.Append(driver_event(12, "unary"), timeout=CALL_DEADLINE_S, metadata=AUTH)
        bad = await stub.Append(
            driver_event(13, "unary-bad", source_key="grpc:nobody"),
            timeout=CALL_DEADLINE_S,
            metadata=AUTH,
        )

    assert (again.status, again.seq, again.ingress_id) == (DUPLICATE, 12, first.ingress_id)
    assert bad.status == REJECTED and "may not publish source" in bad.reason
    assert await rows_for(observer, "unary-bad") == []


# --- the driver client against a real ingress ------------------------------------------


@dataclass
class RunningIngress:
    """An ingress service this test starts and stops itself."""

    service: Service
    task: asyncio.Task[None]

    @property
    def port(self) -> int:
        return self.service.bound_grpc_port

    async def stop(self) -> None:
        self.service.stop()
        await asyncio.wait_for(self.task, 15)


async def start_ingress(
    db: DatabaseSettings,
    spool_dir: Path,
    grpc_port: int = 0,
    settings: GrpcIngressSettings | None = None,
) -> RunningIngress:
    """An ingress on `grpc_port` (0: a free one) against the database `db`."""
    cfg = IngressConfig(
        database=db,
        service=ServiceSettings("ingress", http_port=0, grpc_port=grpc_port),
        admin=AdminSettings("test-admin-token-publish-0123"),
        secrets=SecretStore(env=SECRETS),
        buffers=IngressBuffers(spool_dir),
        grpc=settings or GrpcIngressSettings(),
    )
    service = await build(cfg)
    task = asyncio.create_task(service.run(install_signals=False))
    await asyncio.wait_for(service.started(), 10)
    return RunningIngress(service, task)


@pytest.fixture
async def ingresses(
    db_settings: DatabaseSettings, tmp_path: Path
) -> AsyncIterator[Callable[[int], Awaitable[RunningIngress]]]:
    """Starts ingresses on the test database; stops those still running at the end."""
    running: list[RunningIngress] = []

    async def start(grpc_port: int = 0) -> RunningIngress:
        ingress = await start_ingress(db_settings, tmp_path / "spool", grpc_port)
        running.append(ingress)
        return ingress

    yield start
    for ingress in running:
        if not ingress.task.done():
            await ingress.stop()


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[DriverOutbox]:
    box = DriverOutbox(tmp_path / "driver-outbox.sqlite")
    yield box
    box.close()


def driver_client(target: str, outbox: DriverOutbox, **options: Any) -> DriverClient:
    options.setdefault("ack_timeout_s", 10.0)
    options.setdefault("backoff", Backoff(initial_s=0.05, max_s=0.5))
    options.setdefault("token", DRIVER_TOKEN)
    return DriverClient(target, DRIVER, outbox, deadline_s=120.0, **options)


async def enqueue_range(client: DriverClient, first: int, last: int) -> None:
    for n in range(first, last + 1):
        await client.enqueue(SOURCE, f"ev-{n}", "message", json.loads(envelope(f"ev-{n}")))


async def lock_waits(conn: Conn) -> int:
    cur = await conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


async def test_driver_resends_after_an_ingress_restart_without_loss_or_doubling(
    started: str,
    ingresses: Callable[[int], Awaitable[RunningIngress]],
    outbox: DriverOutbox,
    db_settings: DatabaseSettings,
    observer: Conn,
) -> None:
    first = await ingresses(0)
    port = first.port
    client = driver_client(f"127.0.0.1:{port}", outbox)
    async with client:
        await enqueue_range(client, 1, 100)
        await client.wait_acked(100, timeout=30)

        # Hold the appends of events 101..200 in flight while the ingress goes away.
        async with observer.transaction():
            await observer.execute("LOCK TABLE bus_dedupe IN SHARE ROW EXCLUSIVE MODE")
            await enqueue_range(client, 101, 200)

            async def held() -> bool:
                return client.in_flight == 100 and await lock_waits(observer) > 0

            await wait_for(held, timeout=15, what="events 101..200 in flight, append blocked")
            await first.stop()
        assert client.acked_through() == 100

        await enqueue_range(client, 201, 300)
        await wait_for(_async(lambda: client.streams_opened >= 3), what="reconnect attempts")
        assert client.acked_through() == 100

        await ingresses(port)
        await client.wait_acked(300, timeout=60)

    assert await rows_per_key(db_settings) == {f"ev-{n}": 1 for n in range(1, 301)}
    assert outbox.unacked() == [] and outbox.rejected() == []
    assert outbox.acked_through() == outbox.last_acked_seq() == 300


def _database_name(db: DatabaseSettings) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(db.url)["dbname"])


def refuse_connections(server: PostgresForTests, database: str, refuse: bool) -> None:
    ident = sql.Identifier(database)
    allow = sql.SQL("false" if refuse else "true")
    server.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(ident, allow))
    if refuse:
        server.execute(
            sql.SQL(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = {} AND pid <> pg_backend_pid()"
            ).format(sql.Literal(database))
        )


async def test_no_ack_while_the_database_is_down_then_everything_once(
    started: str,
    ingress_grpc: str,
    outbox: DriverOutbox,
    db_settings: DatabaseSettings,
    postgres_server: PostgresForTests,
) -> None:
    database = _database_name(db_settings)
    async with driver_client(ingress_grpc, outbox) as client:
        await enqueue_range(client, 1, 20)
        await client.wait_acked(20, timeout=30)
        acks_before, streams_before = client.acks_received, client.streams_opened

        refuse_connections(postgres_server, database, refuse=True)
        try:
            await enqueue_range(client, 21, 70)

            def append_failed_twice() -> bool:
                return (
                    client.streams_opened >= streams_before + 2
                    and "append failed" in client.last_error
                )

            await wait_for(_async(append_failed_twice), timeout=30, what="appends failing")
            assert client.acks_received == acks_before
            assert client.acked_through() == 20
        finally:
            refuse_connections(postgres_server, database, refuse=False)

        await client.wait_acked(70, timeout=60)

    assert await rows_per_key(db_settings) == {f"ev-{n}": 1 for n in range(1, 71)}
    assert outbox.unacked() == [] and outbox.rejected() == []


async def test_driver_keeps_rejected_events_with_their_reason(
    started: str, ingress_grpc: str, outbox: DriverOutbox
) -> None:
    async with driver_client(ingress_grpc, outbox) as client:
        good = await client.enqueue(SOURCE, "fine", "message", json.loads(envelope("fine")))
        bad = await client.enqueue(SOURCE, "broken", "message", b"{nope")
        stranger = await client.enqueue("grpc:nobody", "x", "message", envelope("x"))
        await client.wait_acked(stranger, timeout=30)

    assert client.acked_through() == stranger
    reasons = {r.event.seq: r.reason for r in outbox.rejected()}
    assert set(reasons) == {bad, stranger}
    assert reasons[bad].startswith("envelope is not JSON")
    assert reasons[stranger] == "driver 'drv-1' may not publish source 'grpc:nobody'"
    assert good < bad
    assert outbox.unacked() == []


async def test_driver_rotates_its_stream_before_the_deadline_without_errors(
    started: str, ingress_grpc: str, outbox: DriverOutbox
) -> None:
    client = DriverClient(
        ingress_grpc, DRIVER, outbox, deadline_s=1.0, ack_timeout_s=0.3, token=DRIVER_TOKEN
    )
    async with client:
        await enqueue_range(client, 1, 5)
        await wait_for(_async(lambda: client.streams_opened >= 3), what="two rotations")
        await enqueue_range(client, 6, 10)
        await client.wait_acked(10, timeout=10)

    assert client.last_error == ""
    assert outbox.pending_count() == 0


# --- a server that never answers --------------------------------------------------------


class SilentIngress(ingress_pb2_grpc.EventIngressServicer):
    """Reads every event and never acks: a hung server behind a live connection."""

    def __init__(self) -> None:
        self.streams: list[list[int]] = []

    async def Publish(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        seen: list[int] = []
        self.streams.append(seen)
        async for ev in request_iterator:
            seen.append(ev.seq)
        return
        yield  # an async generator that never yields

    async def Append(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "silent")


@pytest.fixture
async def silent() -> AsyncIterator[tuple[SilentIngress, str]]:
    servicer = SilentIngress()
    server = grpc.aio.server()
    ingress_pb2_grpc.add_EventIngressServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(grace=None)


async def test_a_silent_server_counts_as_broken_and_events_are_resent_in_order(
    silent: tuple[SilentIngress, str], outbox: DriverOutbox
) -> None:
    servicer, target = silent
    for n in range(1, 6):
        outbox.enqueue(SOURCE, f"s-{n}", "message", envelope(f"s-{n}"))
    client = DriverClient(target, DRIVER, outbox, 60.0, max_in_flight=2, ack_timeout_s=0.4)

    async with client:
        await wait_for(_async(lambda: len(servicer.streams) >= 3), what="two reconnects")

    # At most max_in_flight unacknowledged on a stream, resent from the first unacked seq.
    assert servicer.streams[0] == [1, 2] and servicer.streams[1] == [1, 2]
    assert "no ack for 0.4s" in client.last_error
    assert client.acked_through() == 0 and outbox.pending_count() == 5


async def test_a_restarted_driver_resends_what_its_outbox_still_holds(
    silent: tuple[SilentIngress, str],
    started: str,
    ingress_grpc: str,
    db_settings: DatabaseSettings,
    tmp_path: Path,
) -> None:
    servicer, silent_target = silent
    path = tmp_path / "restarted-driver.sqlite"
    box = DriverOutbox(path)
    async with DriverClient(silent_target, DRIVER, box, 60.0, ack_timeout_s=5.0) as client:
        await enqueue_range(client, 1, 5)
        await wait_for(_async(lambda: servicer.streams[-1:] == [[1, 2, 3, 4, 5]]), what="sent")
    box.close()

    reopened = DriverOutbox(path)
    try:
        async with driver_client(ingress_grpc, reopened) as client:
            await client.wait_acked(5, timeout=30)
        assert reopened.pending_count() == 0
    finally:
        reopened.close()
    assert await rows_per_key(db_settings) == {f"ev-{n}": 1 for n in range(1, 6)}
