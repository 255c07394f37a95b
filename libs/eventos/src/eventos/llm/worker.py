"""The LLM workers: one Worker per class queue `llm-cN`, each with fixed slots (SPEC §9)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Final

from temporalio.client import Client
from temporalio.worker import Worker

from eventos import names
from eventos.errors import ConfigError
from eventos.llm.activity import HEARTBEAT_S, LlmActivities
from eventos.runtime.build import worker_build_id
from eventos.runtime.temporal import RetryCount, TemporalConnection, until_outage_ends
from eventos.scheduling.policy import DEFAULT_CLASS_MAX

log = logging.getLogger(__name__)
RECONNECT_S = 2.0
# Steps in flight get this long to finish on shutdown; then they are cancelled and retried
# elsewhere by Temporal.
SHUTDOWN_GRACE = timedelta(seconds=5)
# Concurrent steps per class queue in one process; EVENTOS_LLM_SLOTS_C<N> overrides. The
# defaults equal admission's class ceilings, so a granted turn's step never waits for a slot.
DEFAULT_SLOTS: Final = dict(DEFAULT_CLASS_MAX)


def llm_slots(env: Mapping[str, str] | None = None) -> dict[int, int]:
    """Slots per class: the defaults, overridden by `EVENTOS_LLM_SLOTS_C1`…`_C4` (≥ 1)."""
    env = os.environ if env is None else env
    slots = dict(DEFAULT_SLOTS)
    for klass in names.CLASSES:
        var = f"EVENTOS_LLM_SLOTS_C{klass}"
        raw = env.get(var, "").strip()
        if not raw:
            continue
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigError(f"{var} must be a positive integer, got {raw!r}")
        slots[klass] = int(raw)
    return slots


def llm_worker(
    client: Client,
    klass: int,
    slots: int,
    activities: LlmActivities,
    *,
    workflow_queue: str = names.WORKFLOW_QUEUE,
) -> Worker:
    """The worker of class `klass`: `llm_step` on `llm-c<klass>` with `slots` concurrent steps."""
    return Worker(
        client,
        task_queue=names.queue_for(names.LLM_QUEUES[klass], workflow_queue),
        activities=[activities.llm_step],
        max_concurrent_activities=slots,
        graceful_shutdown_timeout=SHUTDOWN_GRACE,
        # Heartbeats reach the server (and bring a cancel back) as often as the step beats,
        # not at 80% of the heartbeat timeout: a cancelled turn drains in seconds.
        max_heartbeat_throttle_interval=timedelta(seconds=HEARTBEAT_S),
        build_id=worker_build_id(),
        interceptors=[RetryCount()],
    )


async def run_llm_workers(
    temporal: TemporalConnection,
    classes: Iterable[int],
    activities: LlmActivities,
    slots: Mapping[int, int] | None = None,
    *,
    workflow_queue: str = names.WORKFLOW_QUEUE,
) -> None:
    """Poll every class queue until cancelled; reconnect while Temporal is unavailable, and
    make new workers when an outage ends (`until_outage_ends`)."""
    classes = tuple(classes)
    slots = llm_slots() if slots is None else slots
    while True:
        try:
            client = await temporal.get()
            workers = [
                llm_worker(client, k, slots[k], activities, workflow_queue=workflow_queue)
                for k in classes
            ]
            await until_outage_ends(client, workers, _run_together(workers))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            cause = exc.exceptions[0] if isinstance(exc, ExceptionGroup) else exc
            log.warning("llm workers stopped (%s); retrying in %.0f s", cause, RECONNECT_S)
            temporal.client = None
            await asyncio.sleep(RECONNECT_S)


async def _run_together(workers: list[Worker]) -> None:
    # One failing worker stops its siblings, so a reconnect never leaves a queue polled twice.
    async with asyncio.TaskGroup() as group:
        for worker in workers:
            group.create_task(worker.run())
