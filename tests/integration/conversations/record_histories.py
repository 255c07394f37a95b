"""Record the Temporal histories the replay test checks new workflow code against.

Not collected by `make test` (no `test_` prefix): run it on the code whose histories you
want to keep, before changing a workflow, and commit what it writes:

    .venv/bin/python -m pytest -q tests/integration/conversations/record_histories.py

It runs an owner chat of three turns on the in-process stack of test_turns: a plain answer,
a tool batch (two calls answered before the next step) and a merge of a message that arrived
while the turn ran; then writes the entity's and each turn's history to tests/histories/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_router import query
from test_turns import Instance, instance  # noqa: F401  (the fixture)

from eventos.testing import wait_for

pytestmark = pytest.mark.temporal

HISTORIES = Path(__file__).resolve().parents[2] / "histories"


async def test_record(instance: Instance) -> None:  # noqa: F811
    await instance.reply(await instance.chat("hello there"))
    await instance.reply(await instance.chat('look up\ncall: lookup {"q": 1}\ncall: weather {}'))
    first = await instance.chat("slow one\nsleep: 2\ncall: lookup {}")

    async def running() -> bool:
        return bool(await query(instance.pool, "SELECT 1 FROM turns WHERE status = 'running'"))

    await wait_for(running, timeout=15, what="the third turn running")
    second = await instance.chat("and also this")
    assert await instance.reply(first) == await instance.reply(second)
    turns = await query(instance.pool, "SELECT id FROM turns ORDER BY n")
    (stream,) = await query(instance.pool, "SELECT entity_id FROM bus_streams")
    HISTORIES.mkdir(exist_ok=True)
    for n, turn in enumerate(turns, 1):
        handle = instance.client.get_workflow_handle(turn["id"])
        await handle.result()
        (HISTORIES / f"turn-{n}.json").write_text((await handle.fetch_history()).to_json())
    # The entity continues as new: every run from the first, following the chain.
    entity = stream["entity_id"]
    described = await instance.client.get_workflow_handle(entity).describe()
    run_id: str | None = described.raw_description.workflow_execution_info.first_run_id
    k = 0
    while run_id:
        k += 1
        history = await instance.client.get_workflow_handle(entity, run_id=run_id).fetch_history()
        (HISTORIES / f"conversation-{k}.json").write_text(history.to_json())
        last = history.events[-1]
        attrs = last.workflow_execution_continued_as_new_event_attributes
        run_id = (
            attrs.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else None
        )
