"""Poll triggers under supervision, on the real dev server and PostgreSQL against a real HTTP
endpoint on loopback: Start runs PollWorkflow, whose one activity pages through the endpoint;
re-arm brings a lost one back at its cursor; Stop ends polling, Resume restarts it, Reset ends
it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from poll_endpoint import PollEndpoint, items
from temporalio.api.enums.v1 import ApplicationErrorCategory
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from test_router import query
from test_supervision import applied, new_employee
from test_turns import (  # noqa: F401 (`instance` is a fixture)
    Instance,
    instance,
    local_spec,
)

from eventos import names
from eventos.control.intent_deliverer import rearm
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal


@pytest.fixture
def endpoint() -> Iterator[PollEndpoint]:
    server = PollEndpoint().start()
    yield server
    server.stop()


def polling(url: str) -> Callable[[str], str]:
    def spec(name: str) -> str:
        return local_spec(
            name,
            f"""    - {{kind: chat}}
    - {{kind: poll, name: feed, interval_s: 30, url: '{url}', cursor_param: after,
        items_path: data.items, cursor_path: meta.next, id_path: id}}
""",
        )

    return spec


async def polled_ids(instance: Instance, name: str) -> list[str]:
    rows = await query(instance.pool, "SELECT dedupe_key, dup_count FROM bus_ingress "
                       "WHERE source_key = %s ORDER BY id", f"poll:{name}/feed")  # fmt: skip
    assert all(r["dup_count"] == 0 for r in rows)
    return [str(r["dedupe_key"]) for r in rows]


async def cursor_of(instance: Instance, name: str) -> str | None:
    rows = await query(instance.pool, "SELECT cursor FROM poll_cursors WHERE employee = %s", name)
    return rows[0]["cursor"] if rows else None


def poll_handle(instance: Instance, name: str) -> WorkflowHandle[object, object]:
    return instance.client.get_workflow_handle(names.poll_id(name, 1, "feed"))


async def status_is(
    handle: WorkflowHandle[object, object], status: WorkflowExecutionStatus
) -> bool:
    return (await handle.describe()).status == status


async def test_start_runs_the_poll_which_pages_with_its_cursor_and_rearm_brings_a_lost_one_back(
    instance: Instance, endpoint: PollEndpoint
) -> None:
    endpoint.page(None, items("a", 50), "p2")
    endpoint.page("p2", items("a", 10, start=40) + items("b", 10), "p3")  # 10 repeats
    endpoint.page("p3", [], None)
    name = await new_employee(instance, polling(endpoint.url))
    await applied(instance, name, "start")
    expected = [f"a-{i}" for i in range(50)] + [f"b-{i}" for i in range(10)]

    async def all_in() -> bool:
        return (
            await polled_ids(instance, name) == expected and await cursor_of(instance, name) == "p3"
        )

    # A full first page: the next comes 2 s later, not after the interval.
    await wait_for(all_in, timeout=30, interval=0.2, what="both pages appended")
    handle = poll_handle(instance, name)
    desc = await handle.describe()
    assert desc.status == WorkflowExecutionStatus.RUNNING
    (pending,) = desc.raw_description.pending_activities
    assert pending.activity_type.name == names.ACT_POLL and pending.attempt >= 3
    assert "next poll in" in pending.last_failure.message
    info = pending.last_failure.application_failure_info
    assert (info.type, info.category) == (
        names.POLL_NEXT,
        ApplicationErrorCategory.APPLICATION_ERROR_CATEGORY_BENIGN,
    )
    # The attempts write no history: the run has only its start and the activity's schedule.
    events = [e async for e in handle.fetch_history_events()]
    assert len(events) < 12, len(events)

    # The items are routed to the employee (its poll subscription) and consumed by turns.
    async def routed() -> bool:
        rows = await query(instance.pool, "SELECT status FROM bus_ingress WHERE source_key = %s",
                           f"poll:{name}/feed")  # fmt: skip
        return all(r["status"] == names.INGRESS_ROUTED for r in rows)

    await wait_for(routed, timeout=30, what="poll items routed")
    # Temporal loses the workflow: re-arm starts it again from the database, at its cursor.
    await handle.terminate("test: Temporal lost it")
    asked = len(endpoint.requests)
    await rearm(instance.pool, instance.client, instance.deliverer.workflow_queue,
                outbox=instance.deliverer.outbox)  # fmt: skip
    await wait_for(lambda: status_is(handle, WorkflowExecutionStatus.RUNNING), what="re-armed")

    async def polled_again() -> bool:
        return len(endpoint.requests) > asked

    await wait_for(polled_again, timeout=20, what="a poll after re-arm")
    assert endpoint.cursors()[asked] == "p3"
    assert endpoint.cursors()[:3] == [None, "p2", "p3"]
    assert await polled_ids(instance, name) == expected


async def test_stop_ends_polling_resume_restarts_it_and_reset_ends_it(
    instance: Instance, endpoint: PollEndpoint
) -> None:
    endpoint.page(None, items("x", 3), "next")
    name = await new_employee(instance, polling(endpoint.url))
    await applied(instance, name, "start")
    await wait_for(lambda: cursor_of(instance, name), timeout=30, what="the first page")
    handle = poll_handle(instance, name)
    first_run = (await handle.describe()).run_id
    await applied(instance, name, "stop")
    # Its next attempt (one interval, ≤ 33 s) finds the generation paused and ends the run,
    # without fetching.
    asked = len(endpoint.requests)
    await wait_for(lambda: status_is(handle, WorkflowExecutionStatus.COMPLETED), timeout=60,
                   interval=0.5, what="the poll ended while paused")  # fmt: skip
    assert len(endpoint.requests) == asked
    assert "paused" in str(await handle.result())
    await applied(instance, name, "resume")

    async def polled_again() -> bool:
        return len(endpoint.requests) > asked

    await wait_for(polled_again, timeout=20, what="a poll after resume")
    assert endpoint.cursors()[-1] == "next"
    again = await handle.describe()
    assert again.status == WorkflowExecutionStatus.RUNNING and again.run_id != first_run
    await applied(instance, name, "reset")
    await wait_for(lambda: status_is(handle, WorkflowExecutionStatus.CANCELED), timeout=20,
                   what="the poll ended by reset")  # fmt: skip
    assert await polled_ids(instance, name) == ["x-0", "x-1", "x-2"]
