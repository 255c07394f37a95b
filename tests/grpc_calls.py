"""What the gRPC EventIngress tests share: events, calls with a token, what got stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from conftest import DRIVER_TOKEN
from prometheus_client import REGISTRY

from eventos.db import Conn
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


async def publish_refused(target: str, token: str = DRIVER_TOKEN) -> tuple[Any, str]:
    """The status and details of a Publish stream the server refuses as it opens. Nothing is
    written: a client writing while the server refuses may see its own send fail first (gRPC's
    "Internal error from Core"), not the server's answer. One the server accepts ends at its
    deadline, DEADLINE_EXCEEDED."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = ingress_pb2_grpc.EventIngressStub(channel).Publish(
            timeout=CALL_S, metadata=bearer(token)
        )
        return await call.code(), str(await call.details())


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


async def lock_waits(conn: Conn) -> int:
    cur = await conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


async def open_stream(target: str, release: asyncio.Event) -> tuple[Any, Any]:
    """A Publish stream that stays open until `release` is set; (channel, call)."""

    async def requests() -> AsyncIterator[Any]:
        await release.wait()
        return
        yield

    channel = grpc.aio.insecure_channel(target)
    stub = ingress_pb2_grpc.EventIngressStub(channel)
    return channel, stub.Publish(requests(), timeout=CALL_S, metadata=bearer(DRIVER_TOKEN))
