"""Driver-side client for `EventIngress.Publish` (SPEC §6.3).

A driver enqueues each upstream event into a local durable outbox (`DriverOutbox`) and
advances its upstream cursor (provider ack, Telegram offset, IMAP UID) only up to
`acked_through()`. The client streams unacknowledged events in seq order, keeps at most
`max_in_flight` outstanding, and after any stream failure reconnects with capped exponential
backoff and resends everything still unacknowledged, in order. A resend of an event whose
append had committed comes back DUPLICATE (the bus dedupes on source and dedupe key), so
nothing is lost and nothing is doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from eventos import names
from eventos.bus.driver_outbox import (
    AckResult,
    AckStatus,
    DriverOutbox,
    OutboxEvent,
    RejectedEvent,
    encode_envelope,
)
from eventos.errors import EventOSError
from eventos.v1 import ingress_pb2, ingress_pb2_grpc

__all__ = [
    "AckResult",
    "AckStatus",
    "Backoff",
    "DriverClient",
    "DriverFailed",
    "DriverOutbox",
    "DriverStreamBroken",
    "OutboxEvent",
    "RejectedEvent",
    "encode_envelope",
]

log = logging.getLogger(__name__)

# Before the stream deadline the sender half-closes and lets in-flight acks drain.
ROTATE_DRAIN_MAX_S = 30.0
# An idle sender still looks at the outbox this often, for events enqueued without notify().
IDLE_POLL_S = 1.0
FLUSH_ON_STOP_S = 5.0
# Pings keep NATs and proxies from dropping a quiet stream and find a dead server; 30 s is
# the ingress's keepalive too and above the 10 s it accepts (EVENTOS_INGRESS_GRPC_*).
CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.http2.ping_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)


class DriverStreamBroken(EventOSError):
    """The Publish stream broke; the client reconnects and resends."""


class DriverFailed(EventOSError):
    """The driver client stopped on an error it cannot retry (its outbox failed)."""


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter between reconnects."""

    initial_s: float = 0.1
    max_s: float = 10.0
    factor: float = 2.0

    def delay(self, attempt: int) -> float:
        ceiling = min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))
        return random.uniform(ceiling / 2, ceiling)


def ack_result(ack: Any) -> AckResult:
    """An Ack off the wire as the outbox records it."""
    statuses = {
        ingress_pb2.Ack.ACCEPTED: AckStatus.ACCEPTED,
        ingress_pb2.Ack.DUPLICATE: AckStatus.DUPLICATE,
        ingress_pb2.Ack.REJECTED: AckStatus.REJECTED,
    }
    status = statuses.get(ack.status)
    if status is None:
        raise DriverStreamBroken(f"ack for seq {ack.seq} has unknown status {ack.status}")
    return AckResult(int(ack.seq), status, str(ack.reason), int(ack.ingress_id))


@dataclass
class _Stream:
    """One Publish call and what is outstanding on it."""

    call: Any = None
    in_flight: deque[int] = field(default_factory=deque)
    room: asyncio.Event = field(default_factory=asyncio.Event)
    last_progress: float = field(default_factory=time.monotonic)
    acked: int = 0


RECONNECTABLE = (grpc.aio.AioRpcError, asyncio.InvalidStateError, DriverStreamBroken)


class DriverClient:
    """Streams a DriverOutbox to the bus and records each Ack (SPEC §6.3)."""

    def __init__(
        self,
        target: str,
        driver_id: str,
        outbox: DriverOutbox,
        deadline_s: float = 600.0,
        *,
        max_in_flight: int = names.PUBLISH_IN_FLIGHT_MAX,
        ack_timeout_s: float = 30.0,
        backoff: Backoff | None = None,
        token: str | None = None,
        root_certificates: bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        """`token` is the driver's token (sent as `authorization: Bearer`); with
        `root_certificates` (PEM) the channel is TLS and the server is verified against them.
        `credentials` replaces both for other set-ups (mTLS)."""
        if not 1 <= max_in_flight <= names.PUBLISH_IN_FLIGHT_MAX:
            raise ValueError(f"max_in_flight must be in 1..{names.PUBLISH_IN_FLIGHT_MAX}")
        if deadline_s <= 0 or ack_timeout_s <= 0:
            raise ValueError("deadline_s and ack_timeout_s must be positive")
        self.target = target
        self.driver_id = driver_id
        self.outbox = outbox
        self.deadline_s = deadline_s
        self.max_in_flight = max_in_flight
        self.ack_timeout_s = ack_timeout_s
        self.backoff = backoff or Backoff()
        if credentials is None and root_certificates is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        self.credentials = credentials
        auth = (("authorization", f"Bearer {token}"),) if token else ()
        self.metadata = (*auth, *metadata)
        # Test hooks and health: tests wait on these instead of sleeping.
        self.streams_opened = 0
        self.acks_received = 0
        self.last_error = ""
        self._wake = asyncio.Event()
        self._acked = asyncio.Condition()
        self._acked_through = 0
        self._received: asyncio.Queue[AckResult] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._current: _Stream | None = None
        self._failure: BaseException | None = None

    async def start(self) -> None:
        """Start streaming in the background."""
        if self._task is not None:
            raise RuntimeError("the driver client is already running")
        self._acked_through = await asyncio.to_thread(self.outbox.acked_through)
        self._failure = None
        self._task = asyncio.create_task(self._run(), name=f"driver-client-{self.driver_id}")

    async def stop(self) -> None:
        """Stop streaming; unacknowledged events stay in the outbox for the next start."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def __aenter__(self) -> DriverClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def enqueue(
        self,
        source_key: str,
        dedupe_key: str,
        type: str,
        envelope: Mapping[str, Any] | bytes,
        body_ref: str = "",
        chain_id: str = "",
        hop: int = 0,
        causation_id: str = "",
    ) -> int:
        """Store an event durably in the outbox and wake the sender; returns its seq."""
        seq = await asyncio.to_thread(
            self.outbox.enqueue,
            source_key,
            dedupe_key,
            type,
            envelope,
            body_ref,
            chain_id,
            hop,
            causation_id,
        )
        self.notify()
        return seq

    def notify(self) -> None:
        """Wake the sender after enqueueing on the outbox directly (from the loop's thread)."""
        self._wake.set()

    def acked_through(self) -> int:
        """The driver may advance its upstream cursor past every event up to this seq."""
        return self._acked_through

    @property
    def in_flight(self) -> int:
        """Events sent on the current stream and not yet acknowledged."""
        return len(self._current.in_flight) if self._current is not None else 0

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the client, if one did."""
        return self._failure

    async def wait_acked(self, seq: int, timeout: float) -> None:
        """Wait until every event up to `seq` is answered; TimeoutError after `timeout`."""
        async with asyncio.timeout(timeout), self._acked:
            await self._acked.wait_for(
                lambda: self._acked_through >= seq or self._failure is not None
            )
        if self._acked_through < seq:
            raise DriverFailed(f"driver client failed: {self._failure}")

    async def _run(self) -> None:
        recorder = asyncio.create_task(self._record_acks())
        connector = asyncio.create_task(self._connect_loop())
        try:
            done, _ = await asyncio.wait({recorder, connector}, return_when=asyncio.FIRST_COMPLETED)
            # Both loop forever: reaching here means one failed.
            failure = next(t.exception() for t in done)
            log.error("driver %s: client stopped", self.driver_id, exc_info=failure)
            async with self._acked:
                self._failure = failure
                self._acked.notify_all()
        finally:
            connector.cancel()
            await asyncio.gather(connector, return_exceptions=True)
            if not recorder.done():
                # Record the acks already received, so the next start resends less.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._received.join(), FLUSH_ON_STOP_S)
            recorder.cancel()
            await asyncio.gather(recorder, return_exceptions=True)

    async def _record_acks(self) -> None:
        while True:
            batch = [await self._received.get()]
            while not self._received.empty():
                batch.append(self._received.get_nowait())
            try:
                through = await asyncio.to_thread(self._record, batch)
            finally:
                for _ in batch:
                    self._received.task_done()
            for r in batch:
                if r.status is AckStatus.REJECTED:
                    log.warning("driver %s: seq %d rejected: %s", self.driver_id, r.seq, r.reason)
            async with self._acked:
                self._acked_through = through
                self._acked.notify_all()

    def _record(self, batch: list[AckResult]) -> int:
        self.outbox.ack_many(batch)
        return self.outbox.acked_through()

    async def _connect_loop(self) -> None:
        attempt = 0
        while True:
            # Every ack of the last stream is recorded first, so no answered event is resent.
            await self._received.join()
            stream = self._current = _Stream()
            self.streams_opened += 1
            try:
                await self._stream(stream)
                attempt = 0  # a clean end: the sender rotated before the deadline
            except RECONNECTABLE as exc:
                attempt = 0 if stream.acked else attempt + 1
                self._broken(exc)
            finally:
                self._current = None
            # Even after a clean end, so a misbehaving server never causes a tight loop.
            await asyncio.sleep(self.backoff.delay(attempt))

    def _broken(self, exc: BaseException) -> None:
        self.last_error = _describe(exc)
        log.warning(
            "driver %s: stream to %s broke (%s); resending from seq %d",
            self.driver_id,
            self.target,
            self.last_error,
            self._acked_through + 1,
        )

    @contextlib.asynccontextmanager
    async def _channel(self) -> AsyncIterator[Any]:
        if self.credentials is None:
            channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.secure_channel(self.target, self.credentials, CHANNEL_OPTIONS)
        async with channel:
            yield channel

    async def _stream(self, s: _Stream) -> None:
        async with self._channel() as channel:
            stub = ingress_pb2_grpc.EventIngressStub(channel)
            s.call = stub.Publish(timeout=self.deadline_s, metadata=self.metadata or None)
            receiver = asyncio.create_task(self._receive(s))
            tasks = {
                receiver,
                asyncio.create_task(self._send(s)),
                asyncio.create_task(self._watch(s)),
            }
            pending = set(tasks)
            try:
                while receiver in pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        t.result()
            except asyncio.InvalidStateError:
                # A write after the call ended: the call's own status says why it ended.
                if not s.call.done():
                    raise
                code, details = await s.call.code(), await s.call.details()
                raise DriverStreamBroken(f"{code.name}: {details}") from None
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                s.call.cancel()

    async def _send(self, s: _Stream) -> None:
        cursor = 0
        drain = min(ROTATE_DRAIN_MAX_S, self.ack_timeout_s, self.deadline_s / 2)
        rotate_at = time.monotonic() + self.deadline_s - drain
        while True:
            while len(s.in_flight) >= self.max_in_flight:
                s.room.clear()
                await s.room.wait()
            remaining = rotate_at - time.monotonic()
            if remaining <= 0:
                await s.call.done_writing()
                return
            self._wake.clear()
            room = self.max_in_flight - len(s.in_flight)
            batch = await asyncio.to_thread(self.outbox.unacked, cursor, room)
            if not batch:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(remaining, IDLE_POLL_S))
                continue
            for ev in batch:
                if not s.in_flight:
                    s.last_progress = time.monotonic()
                s.in_flight.append(ev.seq)
                await s.call.write(self._wire(ev))
                cursor = ev.seq

    async def _receive(self, s: _Stream) -> None:
        while True:
            ack = await s.call.read()
            if ack is grpc.aio.EOF:
                if s.in_flight:
                    raise DriverStreamBroken(f"stream ended with {len(s.in_flight)} unacked")
                return
            result = ack_result(ack)
            if not s.in_flight or s.in_flight[0] != result.seq:
                expected = s.in_flight[0] if s.in_flight else None
                raise DriverStreamBroken(f"ack for seq {result.seq}, expected {expected}")
            s.in_flight.popleft()
            s.room.set()
            s.acked += 1
            s.last_progress = time.monotonic()
            self.acks_received += 1
            self._received.put_nowait(result)

    async def _watch(self, s: _Stream) -> None:
        # A silent server is a broken connection: without this a half-open TCP connection
        # would hold the outstanding events until the stream deadline.
        while True:
            await asyncio.sleep(self.ack_timeout_s / 4)
            if s.in_flight and time.monotonic() - s.last_progress > self.ack_timeout_s:
                raise DriverStreamBroken(
                    f"no ack for {self.ack_timeout_s}s with {len(s.in_flight)} in flight"
                )

    def _wire(self, ev: OutboxEvent) -> Any:
        return ingress_pb2.DriverEvent(
            driver_id=self.driver_id,
            seq=ev.seq,
            source_key=ev.source_key,
            dedupe_key=ev.dedupe_key,
            type=ev.type,
            envelope=ev.envelope,
            body_ref=ev.body_ref,
            chain_id=ev.chain_id,
            hop=ev.hop,
            causation_id=ev.causation_id,
        )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
