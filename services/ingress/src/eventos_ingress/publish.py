"""gRPC `EventIngress` (SPEC §6.3): an Ack only after the append commits.

Each Publish stream appends its events in order, in small batches on its own connection,
so per-source order holds and acks go back in the order the events came.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TypeAlias

import grpc
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.blobs import blob_exists
from eventos.bus import (
    Accepted,
    Duplicate,
    GroupCommitter,
    IngressRecord,
    Outcome,
    Rejected,
    append,
)
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.envelope import check_driver_envelope
from eventos.errors import EventRejected
from eventos.metrics import PUBLISH_ACKS
from eventos.v1 import ingress_pb2, ingress_pb2_grpc
from eventos.wake import Kicker

log = logging.getLogger(__name__)
BATCH_MAX = 256
# Queued plus the batch being appended stay within the in-flight bound per stream.
READ_AHEAD = names.PUBLISH_IN_FLIGHT_MAX - BATCH_MAX
SOURCE_CACHE_S = 1.0
Context: TypeAlias = grpc.aio.ServicerContext[ingress_pb2.DriverEvent, ingress_pb2.Ack]


def ack_for(seq: int, outcome: Outcome) -> ingress_pb2.Ack:
    if isinstance(outcome, Accepted):
        ack = ingress_pb2.Ack(seq=seq, status=ingress_pb2.Ack.ACCEPTED, ingress_id=outcome.id)
    elif isinstance(outcome, Duplicate):
        ack = ingress_pb2.Ack(seq=seq, status=ingress_pb2.Ack.DUPLICATE, ingress_id=outcome.id)
    else:
        ack = ingress_pb2.Ack(seq=seq, status=ingress_pb2.Ack.REJECTED, reason=outcome.reason)
    PUBLISH_ACKS.labels(ingress_pb2.Ack.Status.Name(ack.status)).inc()
    return ack


@dataclass
class EventIngressServicer(ingress_pb2_grpc.EventIngressServicer):
    """Validates drivers' events and appends them."""

    pool: AsyncConnectionPool[Conn]
    committer: GroupCommitter
    kicker: Kicker | None = None
    token: str | None = None
    _sources: dict[str, float] = field(default_factory=dict)

    async def _authorize(self, context: Context) -> None:
        """With a driver token configured, every call must carry `authorization: Bearer <token>`."""
        if self.token is None:
            return
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        expected = f"Bearer {self.token}"
        if not hmac.compare_digest(str(given).encode(), expected.encode()):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid driver token is required")

    async def _known_source(self, conn: Conn, source: str) -> bool:
        seen = self._sources.get(source)
        if seen is not None and time.monotonic() - seen < SOURCE_CACHE_S:
            return True
        cur = await conn.execute(Q["known_source"], {"source_key": source})
        if await cur.fetchone() is None:
            return False
        self._sources[source] = time.monotonic()
        return True

    async def check(self, conn: Conn, ev: ingress_pb2.DriverEvent) -> IngressRecord | Rejected:
        """The record to append, or why the event is rejected."""
        try:
            if not ev.driver_id or not ev.source_key or not ev.dedupe_key or not ev.type:
                raise EventRejected("driver_id, source_key, dedupe_key and type are required")
            envelope = check_driver_envelope(ev.envelope, by_reference=bool(ev.body_ref))
            if ev.body_ref and not await blob_exists(conn, ev.body_ref):
                raise EventRejected(f"unknown body_ref {ev.body_ref!r}")
            if not await self._known_source(conn, ev.source_key):
                raise EventRejected(f"unknown source {ev.source_key!r}")
        except EventRejected as exc:
            return Rejected(str(exc))
        chain = ev.chain_id or (str(envelope["id"]) if envelope else ev.dedupe_key)
        return IngressRecord(
            source_key=ev.source_key,
            dedupe_key=ev.dedupe_key,
            type=ev.type,
            chain_id=chain,
            envelope=envelope,
            size=len(ev.envelope),
            body_ref=ev.body_ref or None,
            hop=ev.hop,
            causation_id=ev.causation_id or None,
        )

    async def _append_batch(self, events: list[ingress_pb2.DriverEvent]) -> list[ingress_pb2.Ack]:
        async with self.pool.connection() as conn:
            checked = [await self.check(conn, ev) for ev in events]
            await conn.commit()
            records = [c for c in checked if isinstance(c, IngressRecord)]
            outcomes = iter(await append(conn, records) if records else [])
        acks = [
            ack_for(ev.seq, c if isinstance(c, Rejected) else next(outcomes))
            for ev, c in zip(events, checked, strict=True)
        ]
        if records and self.kicker is not None:
            self.kicker.kick()
        return acks

    async def Publish(
        self, request_iterator: AsyncIterator[ingress_pb2.DriverEvent], context: Context
    ) -> AsyncIterator[ingress_pb2.Ack]:
        await self._authorize(context)
        # Bounded: at most PUBLISH_IN_FLIGHT_MAX events read and not yet acknowledged.
        inbox: asyncio.Queue[ingress_pb2.DriverEvent | None] = asyncio.Queue(READ_AHEAD)

        async def read() -> None:
            async for ev in request_iterator:
                await inbox.put(ev)
            await inbox.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                first = await inbox.get()
                if first is None:
                    break
                batch = [first]
                ended = False
                while len(batch) < BATCH_MAX and not inbox.empty():
                    nxt = inbox.get_nowait()
                    if nxt is None:
                        ended = True
                        break
                    batch.append(nxt)
                try:
                    acks = await self._append_batch(batch)
                except Exception as exc:
                    # No Ack: the driver keeps the events and resends after reconnecting.
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"append failed: {exc}")
                for ack in acks:
                    yield ack
                if ended:
                    break
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def Append(self, request: ingress_pb2.DriverEvent, context: Context) -> ingress_pb2.Ack:
        await self._authorize(context)
        try:
            async with self.pool.connection() as conn:
                checked = await self.check(conn, request)
            if isinstance(checked, Rejected):
                return ack_for(request.seq, checked)
            outcome = await self.committer.submit(checked)
        except Exception as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"append failed: {exc}")
        if self.kicker is not None:
            self.kicker.kick()
        return ack_for(request.seq, outcome)
