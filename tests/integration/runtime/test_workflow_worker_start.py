"""A workers-workflow process that starts while many workflows wait takes only a few of their
tasks at a time (the fault run, issue 17): replaying an entity's history costs about half a
millisecond an event on one core, and a restarted worker that took every waiting task at once
ran them side by side under the GIL, each past its 10 s timeout; each retry replayed again,
and no turn started for minutes. Tasks beyond its slots wait in Temporal's queue, where no
timeout runs."""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime

from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from eventos import names
from eventos.contracts import StreamCursor
from eventos.db import Conn
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.payload_guard import connect
from eventos.settings import WORKFLOW_TASK_SLOTS, TemporalSettings
from eventos.testing import wait_for
from eventos.workers.activities import DbActivities
from eventos.workers.roles import workflow_worker

WAITING = 16  # entities whose first task waits when the worker starts
CLOSED = (
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
)


async def task_spans(handle: WorkflowHandle[object, object]) -> list[tuple[datetime, datetime]]:
    """(started, closed) of each workflow task the worker took."""
    started: datetime | None = None
    spans = []
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = e.event_time.ToDatetime()
        elif e.event_type in CLOSED and started is not None:
            spans.append((started, e.event_time.ToDatetime()))
            started = None
    return spans


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(c, -1) for _, c in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


async def test_a_starting_worker_takes_a_few_waiting_tasks_at_a_time(
    pool: AsyncConnectionPool[Conn], temporal_settings: TemporalSettings, outbox_keys: OutboxKeys
) -> None:
    client: Client = await connect(temporal_settings.address, temporal_settings.namespace)
    queue, tag = f"wf-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
    handles = []
    for i in range(WAITING):  # no worker polls yet: every first task waits
        cursor = StreamCursor(f"e{tag}/g1/worker/t{i}", f"e{tag}", 1, names.LANE_WORKER,
                              f"t{i}", applied_seq=0, idle_s=1.0)  # fmt: skip
        handles.append(await client.start_workflow(
            names.WF_CONVERSATION, cursor, id=f"conv-{tag}-{i}", task_queue=queue))  # fmt: skip
    try:
        async with workflow_worker(client, queue, DbActivities(pool, outbox=outbox_keys)):

            async def all_taken() -> bool:
                return all([await task_spans(h) for h in handles])

            await wait_for(all_taken, timeout=60, interval=0.2, what="every first task done")
        spans = [span for h in handles for span in await task_spans(h)]
        assert most_at_once(spans) <= WORKFLOW_TASK_SLOTS, spans
    finally:
        for h in handles:
            with contextlib.suppress(RPCError):  # an idle entity has closed by itself
                await h.terminate("test over")
