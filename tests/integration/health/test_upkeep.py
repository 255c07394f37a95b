"""The relay's instance-wide upkeep sweep on the whole in-process stack and the dev server: an
alarm whose `alarms_changed` hint was lost fires from the sweep's loop, late with its note (an
alarm just due is still its supervisor's, a paused generation's waits for Resume), and a
workflow whose workflow task keeps failing (Temporal's `TemporalReportedProblems` flag, after 3
failed tasks in a row) is a `workflow_task_failing` item of its employee until it closes."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from metrics_table import sample
from psycopg_pool import AsyncConnectionPool
from temporalio.common import Priority
from test_alarms import (  # noqa: F401 (`employee` is a fixture)
    armed,
    consumed,
    employee,
    past_alarm,
    supervised_employee,
)
from test_router import query
from test_turns import Instance, instance  # noqa: F401 (the in-process stack fixture)

from eventos import names
from eventos.db import Conn
from eventos.employees import lifecycle
from eventos.health.upkeep import upkeep_loop, upkeep_once
from eventos.runtime.metrics import ALARMS_SWEPT
from eventos.runtime.service import cancel_and_wait
from eventos.runtime.temporal import TemporalConnection
from eventos.settings import AlarmSettings, SupervisionSettings, TemporalSettings
from eventos.testing import wait_for


async def test_an_alarm_whose_hint_was_lost_fires_from_the_sweep(
    instance: Instance,  # noqa: F811
    temporal_settings: TemporalSettings,
) -> None:
    name = await supervised_employee(instance)
    await armed(instance, name)  # its supervisor read the alarms once: none then
    # Set behind the supervisor's back, no `alarms_changed` sent: the hint is lost, and its
    # timer would not look again for up to an hour.
    aid = await past_alarm(instance.pool, name, "renew the domain", 120)
    status = await query(instance.pool, "SELECT status FROM alarms WHERE id = %s", aid)
    assert status == [{"status": "scheduled"}]
    # The relay's loop, sweeping every second here (every 5 minutes by default).
    cfg = SupervisionSettings(upkeep_s=1)
    temporal = TemporalConnection(temporal_settings)
    swept = sample(ALARMS_SWEPT, outcome="fired")
    sweeping = asyncio.create_task(upkeep_loop(instance.pool, temporal, cfg, AlarmSettings()))
    try:
        text = await consumed(instance, name, "renew the domain")
    finally:
        await cancel_and_wait([sweeping], 10)
    assert "[late: due at " in text and "fired 2 min" in text
    assert sample(ALARMS_SWEPT, outcome="fired") == swept + 1
    again = await upkeep_once(instance.pool, None, AlarmSettings())  # fired once, whoever fires
    assert (again.alarms_fired, again.generations) == (0, [])
    rows = await query(instance.pool, "SELECT count(*) AS n FROM bus_ingress WHERE dedupe_key = %s",
                       f"alarm:{aid}")  # fmt: skip
    assert rows == [{"n": 1}]


async def test_the_sweep_leaves_the_just_due_and_a_paused_generations_alarms_alone(
    pool: AsyncConnectionPool[Conn],
    employee: str,  # noqa: F811
) -> None:
    just_due = await past_alarm(pool, employee, "just due", 20)  # still its supervisor's
    done = await upkeep_once(pool, None, AlarmSettings())
    assert (done.alarms_fired, done.generations) == (0, [])
    late = await past_alarm(pool, employee, "late", 600)
    async with pool.connection() as conn:
        await lifecycle.stop(conn, employee)
    done = await upkeep_once(pool, None, AlarmSettings())
    assert (done.alarms_fired, done.generations) == (0, [])  # paused: they wait for Resume
    async with pool.connection() as conn:
        await lifecycle.resume(conn, employee)
    done = await upkeep_once(pool, None, AlarmSettings())  # all that is due, once overdue
    assert (done.alarms_fired, done.generations) == (2, [f"{employee}/g1"])
    rows = await query(pool, "SELECT id, status FROM alarms WHERE employee = %s", employee)
    assert {r["id"]: r["status"] for r in rows} == {just_due: "fired", late: "fired"}


async def item(instance: Instance, ref: str) -> dict[str, Any] | None:  # noqa: F811
    rows = await query(instance.pool, "SELECT employee, severity, state, detail FROM "
                       "attention_items WHERE kind = %s AND ref = %s",
                       names.ATTENTION_WORKFLOW_TASK_FAILING, ref)  # fmt: skip
    return rows[0] if rows else None


async def test_a_workflow_whose_task_keeps_failing_is_an_item_until_it_closes(
    instance: Instance,  # noqa: F811
) -> None:
    # A PollWorkflow of the employee's generation started with an argument it cannot decode:
    # each of its workflow tasks fails on the real worker (the workflow itself never fails).
    wf_id = names.poll_id(instance.name, 1, f"broken-{uuid.uuid4().hex[:6]}")
    handle = await instance.client.start_workflow(
        names.WF_POLL, "not a poll trigger", id=wf_id, task_queue=instance.relay.task_queue,
        priority=Priority(priority_key=4),
    )  # fmt: skip

    async def flagged() -> dict[str, Any] | None:
        done = await upkeep_once(instance.pool, instance.client, AlarmSettings())
        return await item(instance, wf_id) if wf_id in (done.failing or []) else None

    found = await wait_for(flagged, timeout=60, interval=2, what="the failing workflow's item")
    assert (found["employee"], found["severity"], found["state"]) == (
        instance.name, "error", "open")  # fmt: skip
    assert names.WF_POLL in found["detail"] and "WorkerUnhandledFailure" in found["detail"]
    await handle.terminate("test: done")

    async def resolved() -> bool:
        await upkeep_once(instance.pool, instance.client, AlarmSettings())
        return (await item(instance, wf_id) or {}).get("state") == "resolved"

    await wait_for(resolved, timeout=30, interval=1, what="the item resolved once it closed")
