"""The Temporal workers of this package: one builder per role, one registration list."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from temporalio.client import Client
from temporalio.worker import Worker

from eventos import names
from eventos.activities import DbActivities
from eventos.alarms.activity import AlarmActivities
from eventos.errors import ConfigError
from eventos.polls.activities import PollActivities
from eventos.settings import AlarmSettings, SecretStore
from eventos.supervision import SupervisorActivities
from eventos.temporal import RetryCount, TemporalConnection, worker_build_id
from eventos.tools.activity import ToolActivities
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
# Workflow tasks one process runs at once (EVENTOS_WORKFLOW_TASK_SLOTS). A task first replays
# its workflow's history unless the process has it cached (about 0.5 ms an event on one core;
# an entity runs to 4,000 events before continue-as-new): a restarted worker that took every
# waiting task at once ran them side by side under the GIL, each past its 10 s timeout, and
# each retry replayed again, so no turn started for minutes (the fault run). Tasks beyond the
# slots wait in Temporal's queue, where no timeout runs.
WORKFLOW_TASK_SLOTS: Final = 4


def workflow_task_slots(env: Mapping[str, str] | None = None) -> int:
    """`EVENTOS_WORKFLOW_TASK_SLOTS` (≥ 1), else WORKFLOW_TASK_SLOTS."""
    raw = (os.environ if env is None else env).get("EVENTOS_WORKFLOW_TASK_SLOTS", "").strip()
    if not raw:
        return WORKFLOW_TASK_SLOTS
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"EVENTOS_WORKFLOW_TASK_SLOTS must be a positive integer, got {raw!r}")
    return int(raw)


def workflow_worker(
    client: Client,
    task_queue: str = names.WORKFLOW_QUEUE,
    db: DbActivities | None = None,
    tools: ToolActivities | None = None,
    polls: PollActivities | None = None,
) -> Worker:
    """Every workflow type, the database activities, the supervisor's effects, the tool calls
    and the poll activity (SPEC §4 workers-workflow); tools and polls resolve their secrets
    from the environment unless given."""
    activities = []
    if db is not None:
        tools = tools or ToolActivities.from_env(db.pool)
        polls = polls or PollActivities(db.pool, SecretStore.from_env())
        activities = db.workflow_queue_activities() + SupervisorActivities(db.pool).activities()
        activities += tools.activities() + polls.activities()
        activities += AlarmActivities(db.pool, AlarmSettings.from_env()).activities()
    return Worker(client, task_queue=task_queue, workflows=WORKFLOWS, activities=activities,
                  build_id=worker_build_id(), interceptors=[RetryCount()],
                  max_concurrent_workflow_tasks=workflow_task_slots())  # fmt: skip


def egress_worker(
    client: Client, db: DbActivities, workflow_queue: str = names.WORKFLOW_QUEUE
) -> Worker:
    """The send activities on queue `egress`."""
    queue = names.queue_for(names.EGRESS_QUEUE, workflow_queue)
    return Worker(client, task_queue=queue, activities=db.egress_activities(),
                  build_id=worker_build_id(), interceptors=[RetryCount()])  # fmt: skip


async def run_forever(temporal: TemporalConnection, build: Callable[[Client], Any]) -> None:
    """Run the worker `build` makes until cancelled; reconnect while Temporal is unavailable."""
    while True:
        try:
            client = await temporal.get()
            await build(client).run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("worker stopped (%s); retrying in %.0f s", exc, RECONNECT_S)
            temporal.client = None
            await asyncio.sleep(RECONNECT_S)
