"""The Temporal workers of this package: one builder, one registration list."""

from __future__ import annotations

import asyncio
import logging

from temporalio.client import Client
from temporalio.worker import Worker

from eventos import names
from eventos.temporal import TemporalConnection
from eventos.workflows.conversation import ConversationWorkflow

log = logging.getLogger(__name__)
WORKFLOWS = [ConversationWorkflow]
RECONNECT_S = 2.0


def workflow_worker(client: Client, task_queue: str = names.WORKFLOW_QUEUE) -> Worker:
    """The worker for every workflow type (SPEC §4 workers-workflow)."""
    return Worker(client, task_queue=task_queue, workflows=WORKFLOWS)


async def run_workflow_worker(temporal: TemporalConnection, task_queue: str) -> None:
    """Poll until cancelled; reconnect while Temporal is unavailable."""
    while True:
        try:
            client = await temporal.get()
            await workflow_worker(client, task_queue).run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("workflow worker stopped (%s); retrying in %.0f s", exc, RECONNECT_S)
            temporal.client = None
            await asyncio.sleep(RECONNECT_S)
