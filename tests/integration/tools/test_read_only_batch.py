"""The flag `concurrent_read_only_tools` (RFC-0006 §6.3) on the real stack: a model response of
read-only calls runs at most 8 at once, and the results are appended in call order even when
the calls finish in another; without the flag the same batch runs one call at a time."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator

import pytest
from conftest import apply_and_start
from loopback_http import Answer, Loopback, http_employee, loopback
from temporalio.worker import Replayer
from test_router import query
from test_turns import Instance, instance, transcript  # noqa: F401 (the in-process stack fixture)

from eventos import names
from eventos.runtime.payload_guard import GUARDED_DATA_CONVERTER
from eventos.testing import wait_for
from eventos.workers.roles import WORKFLOWS

CALLS = 12  # more than the 8 that may run at once
AT_ONCE = names.READ_ONLY_BATCH_MAX_AT_ONCE
FLAGGED = "spec:\n  flags: {concurrent_read_only_tools: true}\n"


@pytest.fixture
def server() -> Iterator[Loopback]:
    with loopback() as s:
        yield s


def batch(server: Loopback) -> str:
    """One message whose model response is CALLS GETs (`/r/0` … `/r/11`), in that order."""
    lines = [f"call: http_request {json.dumps({'method': 'GET', 'url': f'{server.base_url}/r/{i}'})}"
             for i in range(CALLS)]  # fmt: skip
    return "read them all\n" + "\n".join(lines)


async def pending_tool_calls(stack: Instance, employee: str) -> int:
    """The tool activities Temporal holds scheduled for the employee's turn right now."""
    (turn,) = await query(stack.pool, "SELECT id FROM turns WHERE employee = %s", employee)
    described = await stack.client.get_workflow_handle(turn["id"]).describe()
    pending = described.raw_description.pending_activities
    return len([a for a in pending if a.activity_type.name == names.ACT_TOOL])


@pytest.mark.parametrize(("flagged", "at_once"), [(True, AT_ONCE), (False, 1)])
async def test_a_read_only_batch_runs_at_most_eight_at_once_in_call_order(
    instance: Instance,  # noqa: F811 (the fixture imported above)
    server: Loopback,
    flagged: bool,
    at_once: int,
) -> None:
    name = f"b{uuid.uuid4().hex[:8]}"
    spec = http_employee(name, "[127.0.0.1]")
    await apply_and_start(instance.pool, spec.replace("spec:\n", FLAGGED) if flagged else spec)
    gates = [threading.Event() for _ in range(CALLS)]
    for i in range(CALLS):
        server.answer(f"/r/{i}", Answer(body=json.dumps({"i": i}).encode(), gate=gates[i]))
    r = await instance.api.post(f"/v1/employees/{name}/chat",
                                json={"client_message_id": uuid.uuid4().hex,
                                      "text": batch(server)})  # fmt: skip
    assert r.status_code == 202, r.text

    async def held() -> bool:
        return server.in_flight == at_once

    await wait_for(held, timeout=60, what=f"{at_once} calls at the server")
    # The rest are not even scheduled: the workflow starts the next call as one ends.
    assert await pending_tool_calls(instance, name) == at_once
    # Let the running calls finish last first: their results still go in call order.
    for i in reversed(range(at_once)):
        gates[i].set()

        async def answered(path: str = f"/r/{i}") -> bool:
            return path in server.answered

        await wait_for(answered, timeout=30, what=f"/r/{i} answered")
    for gate in gates:
        gate.set()
    reply = await instance.reply(int(r.json()["message_id"]), name=name, timeout=60)
    assert "http_request" in reply
    assert server.max_in_flight == at_once
    assert len(server.answered) == CALLS
    if flagged:
        assert server.answered[:2] == [f"/r/{AT_ONCE - 1}", f"/r/{AT_ONCE - 2}"]  # out of order

    messages = await transcript(instance.pool, employee=name)
    (asked,) = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
    results = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in asked["tool_calls"]]
    bodies = [json.loads(json.loads(m["content"])["body"]) for m in results]
    assert bodies == [{"i": i} for i in range(CALLS)]

    # The batch's commands replay as they ran (the semaphore wakes its waiters in order).
    (turn,) = await query(instance.pool, "SELECT id FROM turns WHERE employee = %s", name)
    history = await instance.client.get_workflow_handle(turn["id"]).fetch_history()
    replayer = Replayer(workflows=WORKFLOWS, data_converter=GUARDED_DATA_CONVERTER)
    await replayer.replay_workflow(history)
