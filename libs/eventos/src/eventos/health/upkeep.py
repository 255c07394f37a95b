"""The relay's instance-wide upkeep sweep, every `upkeep_s` (5 minutes): what no hint brings
back by itself. Several relays may sweep at once: firing is a compare-and-swap and items are
unique while open.

- **Overdue alarms** (SPEC §10, I1). A generation's supervisor fires its alarms at its one
  timer, which the `alarms_changed` Signal re-arms; a lost Signal left an alarm waiting for the
  supervisor's hourly re-read, and a supervisor that does not run (lost, its task failing) fired
  none. The sweep fires every alarm of a running generation overdue by more than OVERDUE_S
  itself, with the supervisor's own `fire_due` (the same compare-and-swap and dedupe keys: an
  occurrence enters the bus once, whoever fires it; the lateness note and `if_late` apply),
  and counts them in `eventos_alarms_swept_total{outcome}`: a steady count means hints are lost.
- **Workflow tasks that keep failing** (SPEC §12, a Temporal problem). Temporal flags a running
  workflow whose workflow task failed or timed out several times in a row (the search attribute
  `TemporalReportedProblems`; `system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute`
  is 3 on both tiers) and clears the flag at its next good task. One Visibility query lists
  them all, of every type and worker, surviving worker restarts (a worker's failure counter
  names no workflow and resets; describing each workflow would be a call per workflow). Each
  is a `workflow_task_failing` item of its employee (where the database knows the workflow
  id), resolved when its flag clears or it closes; a sweep that cannot reach Temporal leaves
  the items as they are.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final

from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client, WorkflowExecution
from temporalio.common import SearchAttributeKey

from eventos.alarms import store
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.health import watchdogs
from eventos.runtime.metrics import ALARMS_SWEPT
from eventos.runtime.temporal import TemporalConnection
from eventos.settings import AlarmSettings, SupervisionSettings

log = logging.getLogger(__name__)
OVERDUE_S: Final = 60.0  # an alarm this late was not fired by its supervisor
GENERATIONS_READ: Final = 500  # generations with overdue alarms one sweep takes
BATCHES_MAX: Final = 10  # fire_due batches per generation and sweep
PROBLEMS: Final = SearchAttributeKey.for_keyword_list("TemporalReportedProblems")
FAILING_QUERY: Final = (
    'ExecutionStatus = "Running" AND TemporalReportedProblems IN '
    '("category=WorkflowTaskFailed", "category=WorkflowTaskTimedOut")'
)
LIST_TIMEOUT: Final = timedelta(seconds=10)


@dataclass
class Upkept:
    """What one sweep did."""

    alarms_fired: int = 0
    alarms_missed: int = 0
    generations: list[str] = field(default_factory=list)
    failing: list[str] | None = None  # the flagged workflow ids; None without Temporal


async def upkeep_once(pool: AsyncConnectionPool[Conn], client: Client | None,
                      alarm_cfg: AlarmSettings) -> Upkept:  # fmt: skip
    """One sweep; the Temporal part only with a `client`."""
    done = Upkept()
    await fire_overdue_alarms(pool, alarm_cfg, done)
    if client is not None:
        await report_failing_tasks(pool, client, done)
    return done


async def fire_overdue_alarms(pool: AsyncConnectionPool[Conn], cfg: AlarmSettings,
                              done: Upkept) -> None:  # fmt: skip
    """Fire what the supervisors left overdue, generation by generation."""
    async with pool.connection() as conn:
        cur = await conn.execute(Q["alarms_overdue_generations"],
                                 {"late_s": OVERDUE_S, "limit": GENERATIONS_READ})  # fmt: skip
        rows = await cur.fetchall()
        await conn.commit()
        for row in rows:
            employee, generation = str(row["employee"]), int(row["generation"])
            try:
                fired, missed = await _fire_generation(conn, cfg, employee, generation,
                                                       str(row["zone"]))  # fmt: skip
            except Exception as exc:  # one generation's bad row must not stop the others
                await conn.rollback()
                log.warning("upkeep: firing %s g%d's overdue alarms failed: %s", employee,
                            generation, exc)  # fmt: skip
                continue
            done.alarms_fired += fired
            done.alarms_missed += missed
            ALARMS_SWEPT.labels("fired").inc(fired)
            ALARMS_SWEPT.labels("missed").inc(missed)
            done.generations.append(f"{employee}/g{generation}")
            log.warning("upkeep: %s g%d had %d alarm(s) overdue by over %g s (a lost "
                        "alarms_changed hint, or its supervisor is down): %d fired, %d missed "
                        "here", employee, generation, row["overdue"], OVERDUE_S, fired,
                        missed)  # fmt: skip


async def _fire_generation(conn: Conn, cfg: AlarmSettings, employee: str, generation: int,
                           zone: str) -> tuple[int, int]:  # fmt: skip
    """Fire a generation's due alarms in batches (each its own transaction, as the
    supervisor's); answer how many fired and how many were missed."""
    fired = missed = 0
    for _ in range(BATCHES_MAX):
        batch = await store.fire_due(conn, employee, generation, zone, limit=cfg.fire_batch,
                                     note_after_s=cfg.late_note_after_s)  # fmt: skip
        await conn.commit()
        fired, missed = fired + batch.fired, missed + batch.missed
        if batch.fired + batch.missed + batch.cancelled < cfg.fire_batch:
            break
    return fired, missed


async def report_failing_tasks(pool: AsyncConnectionPool[Conn], client: Client,
                               done: Upkept) -> None:  # fmt: skip
    """Raise an item per flagged workflow; resolve those no longer flagged."""
    listed = client.list_workflows(FAILING_QUERY, limit=watchdogs.ITEMS_READ,
                                   rpc_timeout=LIST_TIMEOUT)  # fmt: skip
    flagged = [_flagged(wf) async for wf in listed]
    done.failing = [f.id for f in flagged]
    async with pool.connection() as conn:
        await watchdogs.failing_workflow_tasks(conn, flagged)


def _flagged(wf: WorkflowExecution) -> watchdogs.FlaggedWorkflow:
    """What Temporal says of the workflow: its type, queue and the failure's cause (no text)."""
    problems = wf.typed_search_attributes.get(PROBLEMS) or []
    causes = [p.split("=", 1)[1] for p in problems if p.startswith("cause=")]
    cause = ", ".join(c.removeprefix("WorkflowTaskFailedCause") for c in causes)[:120]
    return watchdogs.FlaggedWorkflow(wf.id, wf.workflow_type, wf.task_queue, cause)


async def upkeep_loop(pool: AsyncConnectionPool[Conn], temporal: TemporalConnection,
                      cfg: SupervisionSettings, alarm_cfg: AlarmSettings) -> None:  # fmt: skip
    """A sweep every `cfg.upkeep_s` until cancelled; a failed sweep is logged and tried again."""
    while True:
        try:
            client = None
            try:
                client = await temporal.get()
            except Exception as exc:  # the alarms still fire; the Temporal part waits
                log.warning("upkeep sweep without Temporal: %s", exc)
            await upkeep_once(pool, client, alarm_cfg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database or Temporal away: try again next time
            log.warning("upkeep sweep failed: %s", exc)
        await asyncio.sleep(cfg.upkeep_s)
