"""The Temporal connection every Temporal-facing service holds, connected lazily.

A service starts and serves /livez while Temporal is down; /readyz reports it until the
client connects (SPEC I2: no request path waits on Temporal). The client's data converter
refuses payloads over 64 KB (I7; eventos.runtime.payload_guard).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    Worker,
)

from eventos import names
from eventos.runtime.metrics import ACTIVITY_RETRIES, RETRY_THRESHOLD
from eventos.runtime.payload_guard import connect
from eventos.settings import TemporalSettings

log = logging.getLogger(__name__)
WAKE_TIMEOUT = timedelta(seconds=5)
HEALTH_TIMEOUT = timedelta(seconds=5)  # a frontend that stopped answering is not ready
# A running worker's watch for the end of an outage (`until_outage_ends`): a health check a
# second; refused this many times in a row, Temporal was down (a slow answer is not an outage).
OUTAGE_PROBE_S = 1.0
OUTAGE_AFTER_REFUSALS = 3


@dataclass
class TemporalConnection:
    """A client that is (re)made on demand."""

    settings: TemporalSettings
    client: Client | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def get(self) -> Client:
        async with self._lock:
            if self.client is None:
                self.client = await connect(self.settings.address, self.settings.namespace)
            return self.client

    async def ready(self) -> None:
        """Raise unless the frontend answers a health check."""
        client = await self.get()
        ok = await client.service_client.check_health(timeout=HEALTH_TIMEOUT)
        if not ok:
            raise RuntimeError("Temporal frontend is not serving")


class RetryCount(Interceptor):
    """Every Worker's interceptor: counts activity attempts (local ones too) past
    `RETRY_THRESHOLD` in `eventos_activity_retries_total`, by activity type."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _RetryCountInbound(next)


class _RetryCountInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.attempt > RETRY_THRESHOLD:
            ACTIVITY_RETRIES.labels(info.activity_type).inc()
        return await super().execute_activity(input)


async def wake_entities(client: Client, workflow_ids: Iterable[str]) -> None:
    """Signal `wake` to entities admission offered a slot. A hint only (I1): a waiting entity
    asks again on its own, so a failed Signal is logged and left."""
    for workflow_id in workflow_ids:
        handle = client.get_workflow_handle(workflow_id)
        try:
            await handle.signal(names.SIGNAL_WAKE, rpc_timeout=WAKE_TIMEOUT)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                log.warning("wake %s failed: %s", workflow_id, exc)


async def until_outage_ends(
    client: Client, workers: Sequence[Worker], running: Awaitable[None]
) -> None:
    """Await `running` (the `workers`' run) until it ends, or, once Temporal refused
    `OUTAGE_AFTER_REFUSALS` health checks in a row and then answers again, until `workers` are
    shut down (the caller makes new ones). After an outage each poller waits out the SDK's
    task-poll backoff (up to 10 s, each queue on its own jitter): the owner's queue could stay
    unpolled for seconds while the other queues' work ran first. New workers poll at once."""
    task = asyncio.ensure_future(running)
    refused = 0
    try:
        while not (await asyncio.wait({task}, timeout=OUTAGE_PROBE_S))[0]:
            try:
                await client.service_client.check_health(timeout=HEALTH_TIMEOUT)
            except RPCError as exc:
                refused = refused + 1 if exc.status == RPCStatusCode.UNAVAILABLE else refused
                continue
            if refused >= OUTAGE_AFTER_REFUSALS:
                log.info("Temporal answers again after an outage: new workers poll at once")
                await asyncio.gather(*(w.shutdown() for w in workers))
            refused = 0
        await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
