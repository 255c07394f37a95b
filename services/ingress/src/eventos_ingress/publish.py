"""gRPC `EventIngress` (SPEC §6.3): an Ack only after the append commits.

Each Publish stream appends its events in order, in small batches on its own connection,
so per-source order holds and acks go back in the order the events came. An event whose own
data is at fault is REJECTED alone and the stream goes on; only a database failure ends the
stream (UNAVAILABLE, no Ack: the driver resends).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import NoReturn, TypeAlias

import grpc
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.bus.blobs import blob_exists
from eventos.bus.envelope import check_driver_envelope
from eventos.bus.inbox import (
    Accepted,
    Duplicate,
    GroupCommitter,
    IngressRecord,
    Outcome,
    Rejected,
    append_isolated,
)
from eventos.db import Conn
from eventos.errors import DatabaseUnavailable, EventRejected, QueueFull
from eventos.runtime.metrics import (
    PUBLISH_ACKS,
    PUBLISH_READ_AHEAD_BYTES,
    PUBLISH_READ_AHEAD_EVENTS,
    PUBLISH_STREAMS,
)
from eventos.runtime.wake import Kicker
from eventos.settings import GrpcIngressSettings
from eventos.v1 import ingress_pb2, ingress_pb2_grpc
from eventos_ingress.credentials import Driver, DriverTable, Internal, Principal, bearer_token

log = logging.getLogger(__name__)
BATCH_MAX = 256
Context: TypeAlias = grpc.aio.ServicerContext[ingress_pb2.DriverEvent, ingress_pb2.Ack]
Event: TypeAlias = ingress_pb2.DriverEvent
REQUIRED = ("driver_id", "source_key", "dedupe_key", "type")
FIELD_LIMITS = {
    "driver_id": names.DRIVER_FIELD_MAX_BYTES,
    "source_key": names.DRIVER_FIELD_MAX_BYTES,
    "dedupe_key": names.DRIVER_DEDUPE_KEY_MAX_BYTES,
    "type": names.DRIVER_FIELD_MAX_BYTES,
    "body_ref": names.DRIVER_FIELD_MAX_BYTES,
    "chain_id": names.DRIVER_FIELD_MAX_BYTES,
    "causation_id": names.DRIVER_FIELD_MAX_BYTES,
}
NOT_PUBLISHABLE = "source not publishable"
UNAUTHENTICATED = "a valid driver or internal token is required (authorization: Bearer <token>)"


async def abort(context: Context, code: grpc.StatusCode, details: str) -> NoReturn:
    """End the call with `code` (context.abort raises; its stub does not say so)."""
    await context.abort(code, details)
    raise AssertionError("context.abort returned")


def ack_for(seq: int, outcome: Outcome) -> ingress_pb2.Ack:
    if isinstance(outcome, Accepted):
        ack = ingress_pb2.Ack(seq=seq, status=ingress_pb2.Ack.ACCEPTED, ingress_id=outcome.id)
    elif isinstance(outcome, Duplicate):
        ack = ingress_pb2.Ack(seq=seq, status=ingress_pb2.Ack.DUPLICATE, ingress_id=outcome.id)
    else:
        ack = ingress_pb2.Ack(seq=seq, status=ingress_pb2.Ack.REJECTED, reason=outcome.reason)
    PUBLISH_ACKS.labels(ingress_pb2.Ack.Status.Name(ack.status)).inc()
    return ack


def check_fields(ev: Event) -> None:
    """EventRejected for a missing field, or a string field too long or holding NUL."""
    if not all(getattr(ev, name) for name in REQUIRED):
        raise EventRejected("driver_id, source_key, dedupe_key and type are required")
    for name, limit in FIELD_LIMITS.items():
        value: str = getattr(ev, name)
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise EventRejected(f"{name} is {size} bytes, over {limit}")
        if "\x00" in value:
            raise EventRejected(f"{name} holds a NUL character")


def check_source(principal: Principal, ev: Event, sources: frozenset[str]) -> None:
    """EventRejected unless `principal` may publish the event's source (SPEC §6.3)."""
    source, kind = ev.source_key, names.source_kind(ev.source_key)
    if ":" not in source:
        raise EventRejected(f"source_key {source!r} is not <kind>:<scope>")
    if kind in names.HTTP_EDGE_SOURCE_KINDS:
        raise EventRejected(f"{NOT_PUBLISHABLE}: {source!r} belongs to the HTTP edge")
    if isinstance(principal, Internal):
        if kind not in names.INTERNAL_SOURCE_KINDS:
            kinds = ", ".join(names.INTERNAL_SOURCE_KINDS)
            raise EventRejected(
                f"{NOT_PUBLISHABLE}: the internal token publishes {kinds} sources, not {source!r}"
            )
        return
    if kind in names.INTERNAL_SOURCE_KINDS:
        raise EventRejected(f"{NOT_PUBLISHABLE}: {source!r} belongs to internal producers")
    if ev.driver_id != principal.driver_id:
        raise EventRejected(
            f"driver_id {ev.driver_id!r} is not the authenticated driver {principal.driver_id!r}"
        )
    if source not in sources:
        raise EventRejected(f"driver {principal.driver_id!r} may not publish source {source!r}")


def driver_chain_id(source: str, dedupe_key: str) -> str:
    """The chain a driver's event starts (SPEC §6.3, §10): chosen by the ingress, scoped by
    the source, so no caller can join or forge another event's chain."""
    raw = f"{source}\x00{dedupe_key}".encode("utf-8", "surrogatepass")
    return f"{source}/{hashlib.sha256(raw).hexdigest()[:32]}"


def record_of(principal: Principal, ev: Event, envelope: dict[str, object] | None) -> IngressRecord:
    """The record to append. Only internal producers carry hop, chain and causation forward
    (I8): a driver's event starts its own chain at hop 0."""
    internal = isinstance(principal, Internal)
    chain = (
        ev.chain_id if internal and ev.chain_id else driver_chain_id(ev.source_key, ev.dedupe_key)
    )
    return IngressRecord(
        source_key=ev.source_key,
        dedupe_key=ev.dedupe_key,
        type=ev.type,
        chain_id=chain,
        envelope=envelope,
        size=len(ev.envelope),
        body_ref=ev.body_ref or None,
        hop=ev.hop if internal else 0,
        causation_id=(ev.causation_id or None) if internal else None,
    )


@dataclass
class ReadAhead:
    """Events read off one stream and not yet acknowledged, bounded in count and in bytes
    (I3): past either bound the stream is simply not read, and HTTP/2 flow control holds
    the sender."""

    max_events: int
    max_bytes: int
    events: int = 0
    bytes: int = 0
    _queue: deque[tuple[Event, int] | None] = field(default_factory=deque)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def _room(self, size: int) -> bool:
        # One event always fits, however large: the message size limit bounds it.
        return self.events == 0 or (
            self.events < self.max_events and self.bytes + size <= self.max_bytes
        )

    async def put(self, ev: Event) -> None:
        size = ev.ByteSize()
        async with self._changed:
            await self._changed.wait_for(lambda: self._room(size))
            self._queue.append((ev, size))
            self.events += 1
            self.bytes += size
            PUBLISH_READ_AHEAD_BYTES.inc(size)
            PUBLISH_READ_AHEAD_EVENTS.inc()
            self._changed.notify_all()

    async def end(self) -> None:
        async with self._changed:
            self._queue.append(None)
            self._changed.notify_all()

    async def take(self, max_items: int) -> tuple[list[tuple[Event, int]], bool]:
        """Up to `max_items` queued events, and whether the stream ended after them."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._queue))
            taken: list[tuple[Event, int]] = []
            while self._queue and len(taken) < max_items:
                item = self._queue.popleft()
                if item is None:
                    return taken, True
                taken.append(item)
            return taken, False

    async def release(self, taken: list[tuple[Event, int]]) -> None:
        size = sum(size for _, size in taken)
        async with self._changed:
            self.events -= len(taken)
            self.bytes -= size
            PUBLISH_READ_AHEAD_BYTES.dec(size)
            PUBLISH_READ_AHEAD_EVENTS.dec(len(taken))
            self._changed.notify_all()

    def close(self) -> None:
        """The stream is over: what it still held is no longer read ahead."""
        PUBLISH_READ_AHEAD_BYTES.dec(self.bytes)
        PUBLISH_READ_AHEAD_EVENTS.dec(self.events)
        self.events = self.bytes = 0


@dataclass
class EventIngressServicer(ingress_pb2_grpc.EventIngressServicer):
    """Authenticates callers, validates their events and appends them."""

    pool: AsyncConnectionPool[Conn]
    committer: GroupCommitter
    credentials: DriverTable
    settings: GrpcIngressSettings = field(default_factory=GrpcIngressSettings)
    kicker: Kicker | None = None
    streams_open: int = 0
    _driver_streams: Counter[str] = field(default_factory=Counter)

    async def _authenticate(self, context: Context) -> Principal:
        given = bearer_token(context.invocation_metadata())
        try:
            principal = await self.credentials.authenticate(given)
        except DatabaseUnavailable as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        if principal is None:
            await abort(context, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)
        return principal

    async def _sources(self, principal: Principal) -> frozenset[str]:
        if isinstance(principal, Driver):
            return await self.credentials.sources_of(principal.driver_id)
        return frozenset()

    async def check(
        self, conn: Conn, ev: Event, principal: Principal, sources: frozenset[str]
    ) -> IngressRecord | Rejected:
        """The record to append, or why the event is rejected."""
        try:
            check_fields(ev)
            check_source(principal, ev, sources)
            envelope = check_driver_envelope(ev.envelope, by_reference=bool(ev.body_ref))
            if ev.body_ref and not await blob_exists(conn, ev.body_ref):
                raise EventRejected(f"unknown body_ref {ev.body_ref!r}")
        except EventRejected as exc:
            return Rejected(str(exc))
        return record_of(principal, ev, envelope)

    async def _append_batch(
        self, principal: Principal, events: list[Event]
    ) -> list[ingress_pb2.Ack]:
        sources = await self._sources(principal)
        async with self.pool.connection() as conn:
            checked = [await self.check(conn, ev, principal, sources) for ev in events]
            await conn.commit()
            records = [c for c in checked if isinstance(c, IngressRecord)]
            # A record the database refuses (RecordInvalid) is Rejected alone.
            outcomes = iter(await append_isolated(conn, records) if records else [])
        acks = [
            ack_for(ev.seq, c if isinstance(c, Rejected) else next(outcomes))
            for ev, c in zip(events, checked, strict=True)
        ]
        if records and self.kicker is not None:
            self.kicker.kick()
        return acks

    async def Publish(
        self, request_iterator: AsyncIterator[Event], context: Context
    ) -> AsyncIterator[ingress_pb2.Ack]:
        principal = await self._authenticate(context)
        if self.streams_open >= self.settings.max_streams:
            await abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {self.settings.max_streams} Publish streams per ingress process",
            )
        who = principal.driver_id if isinstance(principal, Driver) else ""
        if who and self._driver_streams[who] >= self.settings.max_streams_per_driver:
            await abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"driver {who!r} has {self.settings.max_streams_per_driver} Publish streams open",
            )
        self.streams_open += 1
        self._driver_streams[who] += 1
        PUBLISH_STREAMS.inc()
        try:
            async for ack in self._publish(principal, request_iterator, context):
                yield ack
        finally:
            self.streams_open -= 1
            self._driver_streams[who] -= 1
            PUBLISH_STREAMS.dec()

    async def _publish(
        self, principal: Principal, request_iterator: AsyncIterator[Event], context: Context
    ) -> AsyncIterator[ingress_pb2.Ack]:
        ahead = ReadAhead(self.settings.read_ahead_events, self.settings.read_ahead_bytes)

        unreadable: list[BaseException] = []

        async def read() -> None:
            try:
                async for ev in request_iterator:
                    await ahead.put(ev)
            except Exception as exc:  # a message that does not parse (not UTF-8, truncated)
                unreadable.append(exc)
            finally:
                await ahead.end()

        reader = asyncio.create_task(read())
        try:
            ended = False
            while not ended:
                batch, ended = await ahead.take(BATCH_MAX)
                if not batch:
                    continue
                try:
                    acks = await self._append_batch(principal, [ev for ev, _ in batch])
                except Exception as exc:
                    # No Ack: the driver keeps the events and resends after reconnecting.
                    await self._abort_unavailable(context, exc)
                for ack in acks:
                    yield ack
                await ahead.release(batch)
            if unreadable:
                # Everything before it is answered; the driver sees why the stream ended.
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                            f"a message could not be read: {unreadable[0]!r}"[:500])  # fmt: skip
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            ahead.close()

    async def _abort_unavailable(self, context: Context, exc: Exception) -> NoReturn:
        if not isinstance(exc, DatabaseUnavailable):
            log.warning("append failed: %r", exc)
        await abort(context, grpc.StatusCode.UNAVAILABLE, f"append failed: {exc}")

    async def Append(self, request: Event, context: Context) -> ingress_pb2.Ack:
        principal = await self._authenticate(context)
        try:
            sources = await self._sources(principal)
            async with self.pool.connection() as conn:
                checked = await self.check(conn, request, principal, sources)
            if isinstance(checked, Rejected):
                return ack_for(request.seq, checked)
            outcome = await self.committer.submit(checked)
        except QueueFull as exc:
            await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Exception as exc:
            await self._abort_unavailable(context, exc)
        if self.kicker is not None:
            self.kicker.kick()
        return ack_for(request.seq, outcome)
