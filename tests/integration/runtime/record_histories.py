# ruff: noqa: F811  (shares test_turns' `instance` fixture by importing it)
"""Record the Temporal histories the replay gate checks every later release's code against.

Not collected by `make test` (no `test_` prefix): at each release, on that release's code, run

    make record-histories

(`.venv/bin/pytest -q tests/integration/runtime/record_histories.py`) and commit what it writes
to `tests/histories/<release>/` (the eventos version: release_histories.py). It drives the
in-process stack of test_turns (router, relay, intent deliverer, the workflow, LLM and egress
workers on the real dev server and PostgreSQL) through two scenarios, so each history holds
the commands a real run makes:

- `chat-*`: an owner chat of three turns: a plain answer, a tool batch (two calls answered
  before the next step) and a merge of a message that arrived while the turn ran; each turn,
  and the entity's every run (it continues as new) up to its passivation when idle.
- `day-*`: an employee with a poll, a cron trigger and `set_alarm` gated by `approvals.tools`,
  started through its supervisor: the poll appends a page (a cycle), the cron Schedule fires
  (a ScheduleFireWorkflow appends its tick), the owner asks for an alarm and approves the
  call (the turn's ApprovalWorkflow returns `approved`, the tool runs), the alarm fires
  (the supervisor's `alarms_changed` and `fire_alarms`), Stop (the Update `paused`: the poll
  ends at its next attempt) and Reset (the Update `retired`: the supervisor completes).
"""

from __future__ import annotations

import json

import pytest
from poll_endpoint import PollEndpoint, items
from release_histories import this_release_folder
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowHistory
from temporalio.service import RPCError
from test_budget import chat
from test_router import query
from test_supervision import applied, described, new_employee
from test_turns import Instance, instance, local_spec  # noqa: F401  (the fixture)

from eventos import names
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal

POLL_RUN_S = 90  # a poll's next attempt comes within its interval (30 s) and 10 % jitter


def clear(scenario: str) -> None:
    """A scenario recorded again replaces all its files (a chain may have fewer runs now)."""
    for old in this_release_folder().glob(f"{scenario}-*.json"):
        old.unlink()


def write(name: str, history: WorkflowHistory) -> None:
    folder = this_release_folder()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(history.to_json())


async def history(instance: Instance, workflow_id: str) -> WorkflowHistory:
    return await instance.client.get_workflow_handle(workflow_id).fetch_history()


async def write_chain(instance: Instance, prefix: str, workflow_id: str) -> None:
    """Every run of a workflow that continues as new, from the first, as `<prefix>-<k>`."""
    described_ = await instance.client.get_workflow_handle(workflow_id).describe()
    run_id: str | None = described_.raw_description.workflow_execution_info.first_run_id
    k = 0
    while run_id:
        k += 1
        got = await instance.client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        write(f"{prefix}-{k}", got)
        last = got.events[-1]
        attrs = last.workflow_execution_continued_as_new_event_attributes
        continued = last.HasField("workflow_execution_continued_as_new_event_attributes")
        run_id = attrs.new_execution_run_id if continued else None


async def test_record_an_owner_chat(instance: Instance) -> None:
    clear("chat")
    await instance.reply(await instance.chat("hello there"))
    await instance.reply(await instance.chat('look up\ncall: lookup {"q": 1}\ncall: weather {}'))
    first = await instance.chat("slow one\nsleep: 2\ncall: lookup {}")

    async def running() -> bool:
        return bool(await query(instance.pool, "SELECT 1 FROM turns WHERE status = 'running'"))

    await wait_for(running, timeout=15, what="the third turn running")
    second = await instance.chat("and also this")
    assert await instance.reply(first) == await instance.reply(second)
    q = "SELECT id FROM turns WHERE employee = %s ORDER BY n"
    turns = await query(instance.pool, q, instance.name)
    for n, turn in enumerate(turns, 1):
        await instance.client.get_workflow_handle(turn["id"]).result()
        write(f"chat-turn-{n}", await history(instance, turn["id"]))
    q = "SELECT entity_id FROM bus_streams WHERE employee = %s"
    (stream,) = await query(instance.pool, q, instance.name)
    entity = instance.client.get_workflow_handle(stream["entity_id"])
    # Idle (3 s here), the entity passivates: its last run holds the close sequence.
    await wait_for(lambda: status_is(entity, WorkflowExecutionStatus.COMPLETED), timeout=60,
                   interval=0.5, what="the entity passivated")  # fmt: skip
    await write_chain(instance, "chat-conversation", entity.id)


def working_day(url: str) -> object:
    """Owner chat, an hourly cron, a poll of `url`, and `set_alarm` held for the owner."""

    def spec(name: str) -> str:
        triggers = f"""    - {{kind: chat}}
    - {{kind: cron, name: hourly, schedule: "0 * * * *", text: "hourly chore"}}
    - {{kind: poll, name: feed, interval_s: 30, url: '{url}', cursor_param: after,
        items_path: data.items, cursor_path: meta.next, id_path: id}}
"""
        text = local_spec(name, triggers) + "  approvals: {tools: [set_alarm]}\n"
        return text.replace("name: scripted}}]", "name: scripted}, tools: [set_alarm]}]")

    return spec


async def status_is(handle: WorkflowHandle[object, object], status: WorkflowExecutionStatus
                    ) -> bool:  # fmt: skip
    return (await handle.describe()).status == status


async def test_record_a_working_day(instance: Instance) -> None:
    endpoint = PollEndpoint().start()
    try:
        endpoint.page(None, items("feed", 3), "next")
        name = await new_employee(instance, working_day(endpoint.url))
        await applied(instance, name, "start")
        clear("day")
        await record_the_day(instance, name)
    finally:
        endpoint.stop()


async def record_the_day(instance: Instance, name: str) -> None:
    async def polled() -> bool:
        q = "SELECT cursor FROM poll_cursors WHERE employee = %s"
        return [r["cursor"] for r in await query(instance.pool, q, name)] == ["next"]

    await wait_for(polled, timeout=30, what="the poll's first cycle")
    schedule = instance.client.get_schedule_handle(names.schedule_id(name, 1, "hourly"))
    await wait_for(lambda: described(schedule), timeout=30, what="the Schedule created")
    await schedule.trigger()

    async def fired() -> str | None:
        actions = (await schedule.describe()).info.recent_actions
        return actions[-1].action.workflow_id if actions else None

    fire_id = await wait_for(fired, timeout=30, what="the Schedule's action")
    await instance.client.get_workflow_handle(fire_id).result()
    write("day-schedule-fire", await history(instance, fire_id))

    alarm = json.dumps({"text": "call the bank", "in_s": 2})
    asked = await chat(instance, name, f"remind me\ncall: set_alarm {alarm}")

    async def pending() -> str | None:
        r = await instance.api.get("/v1/approvals", params={"state": "pending", "employee": name})
        rows = r.json()["approvals"]
        return str(rows[0]["id"]) if rows else None

    approval = await wait_for(pending, timeout=60, what="the tool call held for approval")
    approval_id = f"approval-{approval}"

    async def waiting() -> bool:
        """The ApprovalWorkflow read the row and waits (its timer): the decision nudges it."""
        try:
            got = await history(instance, approval_id)
        except RPCError:  # the row commits just before the turn starts its child
            return False
        return any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in got.events)

    await wait_for(waiting, timeout=30, what="the approval's workflow waiting")
    r = await instance.api.post(f"/v1/approvals/{approval}:approve")
    assert r.status_code == 202, r.text
    await instance.reply(asked, timeout=60, name=name)

    async def alarm_fired() -> bool:
        q = "SELECT status FROM alarms WHERE employee = %s"
        return [r["status"] for r in await query(instance.pool, q, name)] == ["fired"]

    await wait_for(alarm_fired, timeout=30, what="the alarm fired by the supervisor")
    assert await instance.client.get_workflow_handle(approval_id).result() == "approved"
    write("day-approval", await history(instance, approval_id))
    (turn,) = await query(instance.pool, "SELECT turn_id FROM approvals WHERE id = %s", approval)
    write("day-turn-approval", await history(instance, turn["turn_id"]))

    poll = instance.client.get_workflow_handle(names.poll_id(name, 1, "feed"))
    await applied(instance, name, "stop")
    await wait_for(lambda: status_is(poll, WorkflowExecutionStatus.COMPLETED), timeout=POLL_RUN_S,
                   interval=0.5, what="the poll ended at its next attempt")  # fmt: skip
    write("day-poll", await poll.fetch_history())
    await applied(instance, name, "reset")
    supervisor = instance.client.get_workflow_handle(names.supervisor_id(name, 1))
    await supervisor.result()
    await write_chain(instance, "day-supervisor", supervisor.id)
