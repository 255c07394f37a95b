"""Reset mid-backlog settles everything the retired generation never consumed (SPEC §3, §8):
on the real dev server and PostgreSQL with the relay, router and intent deliverer running."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from test_router import append_all, driver_event, query
from test_supervision import applied, new_employee
from test_turns import (  # noqa: F401 (`instance` is a fixture)
    Instance,
    instance,
    owner_and_driver,
    step_started,
)

from eventos.employees import lifecycle
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal

SUBJECTS = ("ada", "bo", "cy")  # one conversation each (thread_by: subject)
PER_SUBJECT = 40  # more than the window (32 delivered, unconsumed): some stay pending
SLOW = "sleep: 120"  # each turn's model step outlasts the test: nothing is consumed

BY_STATUS = """SELECT d.id, d.status, d.reason, d.stream_key FROM bus_deliveries d
               JOIN bus_streams s USING (stream_key)
               WHERE s.employee = %s AND s.generation = %s ORDER BY d.id"""


async def deliveries(instance: Instance, name: str, generation: int) -> list[dict[str, Any]]:
    return await query(instance.pool, BY_STATUS, name, generation)


async def chat(instance: Instance, name: str, text: str) -> int:
    """The owner's message to `name`; its id."""
    r = await instance.api.post(f"/v1/employees/{name}/chat",
                                json={"client_message_id": uuid.uuid4().hex, "text": text})  # fmt: skip
    assert r.status_code == 202, r.text
    return int(r.json()["message_id"])


async def dead_letters(instance: Instance, name: str) -> set[str]:
    """Every dead letter of the employee with reason `reset`, across pages."""
    ids: set[str] = set()
    params = {"employee": name, "reason": "reset", "limit": "200"}
    while True:
        r = await instance.api.get("/v1/dead-letters", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert {row["reason"] for row in page["dead_letters"]} <= {"reset"}
        ids |= {row["id"] for row in page["dead_letters"]}
        if not page.get("next_cursor"):
            return ids
        params["cursor"] = page["next_cursor"]


async def test_reset_mid_backlog_leaves_nothing_open_and_the_next_generation_consumes(
    instance: Instance,
) -> None:
    name = await new_employee(instance, owner_and_driver)
    await applied(instance, name, "start")
    source = f"grpc:drv-{name}"
    events = [driver_event(s, n, source, text=SLOW) for n in range(PER_SUBJECT) for s in SUBJECTS]
    await append_all(instance.pool, events)
    chats = [await chat(instance, name, f"{SLOW}\nowner {n}") for n in range(3)]  # there too

    async def backlog_in_flight() -> list[dict[str, Any]] | None:
        """Each conversation runs a turn, holds delivered inputs and has more pending."""
        rows = await deliveries(instance, name, 1)
        running = await query(instance.pool, "SELECT stream_key FROM turns WHERE employee = %s "
                              "AND status = 'running'", name)  # fmt: skip
        streams = {r["stream_key"] for r in rows}
        for key in streams:
            mine = [r["status"] for r in rows if r["stream_key"] == key]
            if key.endswith("/talk/main"):  # the owner's chat: one in its turn, two delivered
                if mine.count("delivered") != len(chats):
                    return None
            elif mine.count("delivered") <= 16 or "pending" not in mine:
                return None  # more than one batch signalled, the rest still in the database
        busy = {r["stream_key"] for r in running}
        if len(rows) != len(events) + len(chats) or len(streams) != len(SUBJECTS) + 1:
            return None
        if busy != streams:
            return None
        return rows

    before = await wait_for(backlog_in_flight, timeout=60, what="a backlog in every conversation")
    delivered = {f"delivery-{r['id']}" for r in before if r["status"] == "delivered"}
    await applied(instance, name, "reset")

    # In the Reset's own transaction: nothing of generation 1 is left pending, held or delivered.
    after = await deliveries(instance, name, 1)
    assert [r for r in after if r["status"] in ("pending", "held", "delivered")] == []
    assert {(r["status"], r["reason"]) for r in after} == {("dead", "reset")}
    letters = await dead_letters(instance, name)
    assert letters == {f"delivery-{r['id']}" for r in after}
    assert delivered <= letters  # those signalled to the cancelled conversations too
    for message_id in chats:  # the owner's messages say so, rather than `queued` for ever
        r = await instance.api.get(f"/v1/employees/{name}/chat/{message_id}")
        assert (r.json()["status"], r.json()["reply"]) == ("dead", None)

    entities = await query(instance.pool, "SELECT entity_id FROM bus_streams WHERE employee = %s "
                           "AND generation = 1", name)  # fmt: skip

    async def entities_closed() -> bool:
        for e in entities:
            d = await instance.client.get_workflow_handle(e["entity_id"]).describe()
            if d.status == WorkflowExecutionStatus.RUNNING:
                return False
        return True

    await wait_for(entities_closed, timeout=60, what="the retired conversations closed")
    settled = await deliveries(instance, name, 1)  # their turns' drains consumed nothing
    assert {(r["status"], r["reason"]) for r in settled} == {("dead", "reset")}

    # Inputs after the Reset go to the next generation and are consumed there.
    await applied(instance, name, "start")
    await append_all(instance.pool, [driver_event(s, 100, source, text="hi") for s in SUBJECTS])

    async def consumed() -> bool:
        rows = await deliveries(instance, name, 2)
        return len(rows) == len(SUBJECTS) and {r["status"] for r in rows} == {"done"}

    await wait_for(consumed, timeout=60, what="generation 2 consumed the new inputs")
    assert len(await deliveries(instance, name, 1)) == len(events) + len(chats)


async def test_a_turn_that_saves_after_the_reset_committed_settles_its_inputs_done(
    instance: Instance,
) -> None:
    """The Reset's commit comes first, its cancel reaches the conversation later (the
    deliverer's next pass): a turn that saves in between consumed its input, which is then
    `done`, not a dead letter that a replay would run twice."""
    name = await new_employee(instance, owner_and_driver)
    await applied(instance, name, "start")
    message_id = await chat(instance, name, "sleep: 3")

    async def running_turn() -> str | None:
        rows = await query(instance.pool, "SELECT id FROM turns WHERE employee = %s "
                           "AND status = 'running'", name)  # fmt: skip
        return str(rows[0]["id"]) if rows else None

    await step_started(instance, await wait_for(running_turn, timeout=30, what="the turn"))
    async with instance.pool.connection() as conn:
        await lifecycle.reset(conn, name)  # the database side alone: no cancel reaches it
    assert {(r["status"], r["reason"]) for r in await deliveries(instance, name, 1)} == {
        ("dead", "reset")
    }

    async def consumed() -> bool:
        rows = await deliveries(instance, name, 1)
        return [(r["status"], r["reason"]) for r in rows] == [("done", None)]

    await wait_for(consumed, timeout=30, what="the turn's save settled its input done")
    assert await dead_letters(instance, name) == set()

    async def answered() -> dict[str, Any] | None:
        # The save marks the message answered; egress adds the reply when it sends it.
        doc: dict[str, Any] = (
            await instance.api.get(f"/v1/employees/{name}/chat/{message_id}")
        ).json()
        return doc if doc["reply"] is not None else None

    doc = await wait_for(answered, timeout=30, what="the reply sent")
    assert doc["status"] == "answered" and "[local]" in doc["reply"]
