"""Poison never stalls a Publish stream (SPEC §6.3): an event whose own data is at fault is
REJECTED alone, stores nothing, and the stream goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from conftest import (
    DRIVER_TOKEN,
)
from grpc_calls import (
    ACCEPTED,
    CALL_S,
    DUPLICATE,
    REJECTED,
    SOURCE,
    bearer,
    event,
    publish,
    stored,
)

from eventos.db import Conn, connect
from eventos.settings import (
    DatabaseSettings,
)
from eventos.v1 import ingress_pb2


@pytest.fixture
async def observer(db_settings: DatabaseSettings) -> AsyncIterator[Conn]:
    conn = await connect(db_settings, autocommit=True)
    async with conn:
        yield conn


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
