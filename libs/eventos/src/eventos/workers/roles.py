"""The Temporal workers of this package: one builder per role, one registration list."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from eventos import names
from eventos.alarms.activity import AlarmActivities
from eventos.control.supervisor import SupervisorActivities
from eventos.polls.activities import PollActivities
from eventos.runtime import payload_visits
from eventos.runtime.build import worker_build_id
from eventos.runtime.temporal import RetryCount, TemporalConnection, until_outage_ends
from eventos.settings import AlarmSettings, SecretStore, WorkflowSettings
from eventos.tools.activity import ToolActivities
from eventos.workers.activities import DbActivities
from eventos.workflows.approval import ApprovalWorkflow
from eventos.workflows.conversation import ConversationWorkflow
from eventos.workflows.poll import PollWorkflow
from eventos.workflows.schedule_fire import ScheduleFireWorkflow
from eventos.workflows.supervisor import EmployeeSupervisorWorkflow
from eventos.workflows.turn import TurnWorkflow

log = logging.getLogger(__name__)
WORKFLOWS = [ConversationWorkflow, TurnWorkflow, EmployeeSupervisorWorkflow, ScheduleFireWorkflow,
             PollWorkflow, ApprovalWorkflow]  # fmt: skip
RECONNECT_S = 2.0


def workflow_worker(
    client: Client,
    task_queue: str = names.WORKFLOW_QUEUE,
    db: DbActivities | None = None,
    tools: ToolActivities | None = None,
    polls: PollActivities | None = None,
    *,
    owner: bool = False,
    turns: bool = False,
) -> Worker:
    """Every workflow type, the database activities, the supervisor's effects, the tool calls
    and the poll activity (SPEC §4 workers-workflow); tools and polls resolve their secrets
    from the environment unless given. With `owner`, the worker of the owner's workflow queue
    beside `task_queue` (the owner's conversations and their turns), with `turns` that of the
    other conversations' turns, each with slots of its own: a workers-workflow process runs
    the three."""
    activities = []
    if db is not None:
        tools = tools or ToolActivities.from_env(db.pool)
        polls = polls or PollActivities(db.pool, SecretStore.from_env())
        activities = db.workflow_queue_activities() + SupervisorActivities(db.pool).activities()
        activities += tools.activities() + polls.activities()
        activities += AlarmActivities(db.pool, AlarmSettings.from_env()).activities()
    settings = WorkflowSettings.from_env()
    queue, slots = task_queue, settings.task_slots
    if owner:
        queue, slots = names.owner_queue(task_queue), settings.owner_task_slots
    elif turns:
        queue, slots = names.turn_queue(task_queue), settings.turn_task_slots
    payload_visits.install()  # no codec, no external storage: no walks over every payload
    return Worker(client, task_queue=queue, workflows=WORKFLOWS, activities=activities,
                  build_id=worker_build_id(), interceptors=[RetryCount()],
                  max_concurrent_workflow_tasks=slots)  # fmt: skip


def egress_worker(
    client: Client, db: DbActivities, workflow_queue: str = names.WORKFLOW_QUEUE
) -> Worker:
    """The send activities on queue `egress`."""
    queue = names.queue_for(names.EGRESS_QUEUE, workflow_queue)
    return Worker(client, task_queue=queue, activities=db.egress_activities(),
                  build_id=worker_build_id(), interceptors=[RetryCount()])  # fmt: skip


async def run_forever(temporal: TemporalConnection, build: Callable[[Client], Any]) -> None:
    """Run the worker `build` makes until cancelled; reconnect while Temporal is unavailable,
    and make a new one when an outage ends (`until_outage_ends`)."""
    while True:
        try:
            client = await temporal.get()
            worker = build(client)
            await until_outage_ends(client, [worker], worker.run())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("worker stopped (%s); retrying in %.0f s", exc, RECONNECT_S)
            temporal.client = None
            await asyncio.sleep(RECONNECT_S)
