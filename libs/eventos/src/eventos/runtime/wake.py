"""The Wake kick (SPEC §4): a post-commit hint over gRPC, backed by a 1 s poll.

A kick is never the only way work is found (I1): receivers also poll, so a lost kick
only delays work by the poll interval.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc

from eventos.runtime.metrics import KICKS_SENT
from eventos.v1 import wake_pb2, wake_pb2_grpc

log = logging.getLogger(__name__)
KICK_DEADLINE_S = 0.5


class WakeSignal:
    """What a kick sets; the service's loop waits on it with its poll interval as timeout."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._forks: list[WakeSignal] = []

    def set(self) -> None:
        self._event.set()
        for fork in self._forks:
            fork.set()

    def fork(self) -> WakeSignal:
        """A signal set with this one and cleared on its own: each loop of a service that
        waits for the same kicks waits on a fork of its own (one loop's wait must not clear
        a kick another loop has not seen)."""
        fork = WakeSignal()
        self._forks.append(fork)
        return fork

    async def wait(self, timeout: float) -> bool:
        """True when kicked before `timeout`; clears the signal either way."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._event.clear()


class WakeServicer(wake_pb2_grpc.WakeServicer):
    """Receives kicks."""

    def __init__(self, signal: WakeSignal) -> None:
        self.signal = signal

    async def Kick(
        self, request: wake_pb2.KickRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> wake_pb2.KickReply:
        self.signal.set()
        return wake_pb2.KickReply()


@dataclass
class Kicker:
    """Sends kicks to targets; coalesces kicks while one is in flight."""

    targets: tuple[str, ...]
    reason: str
    _channels: list[grpc.aio.Channel] = field(default_factory=list)
    _dirty: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._channels = [grpc.aio.insecure_channel(t) for t in self.targets]
        self._task = asyncio.create_task(self._run())

    def kick(self) -> None:
        """Ask for a kick soon; never blocks and never fails the caller."""
        self._dirty.set()

    async def _run(self) -> None:
        stubs = [wake_pb2_grpc.WakeStub(ch) for ch in self._channels]
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await asyncio.gather(*(self._send(s) for s in stubs))

    async def _send(self, stub: wake_pb2_grpc.WakeStub) -> None:
        try:
            await stub.Kick(wake_pb2.KickRequest(reason=self.reason), timeout=KICK_DEADLINE_S)
            KICKS_SENT.labels("ok").inc()
        except grpc.aio.AioRpcError:
            KICKS_SENT.labels("failed").inc()  # the receiver's poll picks the work up

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for ch in self._channels:
            await ch.close()
