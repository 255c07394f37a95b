"""Who may publish what over gRPC EventIngress (SPEC §6.3, I8), on a real port against real
PostgreSQL: driver tokens bound to their sources, the internal token, chains a driver cannot set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from conftest import (
    COURIER_DRIVER_TOKEN,
    DRIVER_TOKEN,
    INTERNAL_TOKEN,
    apply_and_start,
)
from eventos_ingress.publish import driver_chain_id
from grpc_calls import (
    ACCEPTED,
    CALL_S,
    COURIER,
    REJECTED,
    SOURCE,
    append,
    bearer,
    event,
    publish,
    stored,
)
from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn, connect
from eventos.employees import lifecycle
from eventos.settings import (
    DatabaseSettings,
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
        await lifecycle.reset(conn, courier)

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
