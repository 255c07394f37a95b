"""No wedges (issue 25 point 9) and tool failures that say a short reason (point 3), on the
real dev server and PostgreSQL through the whole owner-chat path (test_turns' instance):
a model reply with a NUL is saved with U+FFFD in its place; a record the database refuses is
tried a bounded number of times, then the turn fails with its reason; a tool call the database
refuses tells the model a fixed reason, never the database's text."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest
from conftest import apply_and_start
from test_router import query
from test_turns import Instance, instance, local_spec, transcript  # noqa: F401 (a fixture)

from eventos.bus.jsonsafe import REPLACEMENT
from eventos.testing import wait_for
from eventos.workers.activities import RECORD_ERROR_ATTEMPTS

pytestmark = pytest.mark.temporal


async def test_a_reply_with_a_nul_is_saved_with_the_replacement_and_the_turn_completes(
    instance: Instance,  # noqa: F811
) -> None:
    mid = await instance.chat('answer oddly\nsay: "before\\u0000after"')
    reply = await instance.reply(mid, timeout=30)
    assert reply == f"[local] before{REPLACEMENT}after"
    (out,) = await query(instance.pool, "SELECT status, body FROM outbound_messages")
    assert out == {"status": "sent", "body": reply}
    assert [m["content"] for m in await transcript(instance.pool)][-1] == reply
    (turn,) = await query(instance.pool, "SELECT status FROM turns")
    assert turn["status"] == "done"
    rows = await query(instance.pool, "SELECT kind FROM employee_timeline WHERE employee = %s",
                       instance.name)  # fmt: skip
    assert rows  # the timeline was written from the stored rows


async def test_a_record_the_database_refuses_fails_the_turn_with_its_reason(
    instance: Instance,  # noqa: F811
) -> None:
    """The save's outbox row breaks a constraint on every attempt (as a record PostgreSQL
    cannot store would): a bounded number of attempts, then the turn fails, is tried once
    more, and its input is dead-lettered with the reason; the conversation goes on."""
    async with instance.pool.connection() as conn:
        await conn.execute("ALTER TABLE outbound_messages ADD CONSTRAINT no_poison "
                           "CHECK (body NOT LIKE '%%poison-pill%%')")  # fmt: skip
    bad = await instance.chat("here is a poison-pill")

    async def dead() -> bool:
        rows = await query(instance.pool, f"SELECT status FROM chat_messages WHERE id = {bad}")
        return rows[0]["status"] == "dead"

    await wait_for(dead, timeout=90, what="the refused turn's input dead-lettered")
    turns = await query(instance.pool, "SELECT status, error FROM turns ORDER BY n")
    assert [t["status"] for t in turns] == ["failed", "failed"]
    for t in turns:
        assert t["error"] == (
            "invalid_request: RecordRefused: the database refused a record: unstorable (23514)"
        )  # category, type, the refusal's reason
        assert "poison" not in t["error"]  # the reason, never the row
    (delivery,) = await query(instance.pool, "SELECT status, reason FROM bus_deliveries")
    assert delivery["status"] == "dead"
    assert delivery["reason"] == f"turn_failed: {turns[0]['error']}"
    saves = await save_attempts(instance)
    assert saves == [RECORD_ERROR_ATTEMPTS, RECORD_ERROR_ATTEMPTS]
    good = await instance.chat("and now a normal one")
    assert "a normal one" in await instance.reply(good)


async def save_attempts(inst: Instance) -> list[int]:
    """How many times each turn's save ran (its local activity markers' attempts)."""
    rows = await query(inst.pool, "SELECT id FROM turns ORDER BY n")
    counts = []
    for row in rows:
        history = await inst.client.get_workflow_handle(str(row["id"])).fetch_history()
        attempts = 0
        for event in history.events:
            if event.HasField("marker_recorded_event_attributes"):
                details = event.marker_recorded_event_attributes.details
                if "data" in details:
                    data = json.loads(details["data"].payloads[0].data)
                    if str(data.get("activity_id", "")).endswith(":save"):
                        attempts = max(attempts, int(data.get("attempt", 0)))
        counts.append(attempts)
    return counts


async def test_a_tool_call_the_database_refuses_tells_the_model_a_short_reason(
    instance: Instance,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"k{uuid.uuid4().hex[:8]}"
    spec = local_spec(name, "    - {kind: chat}\n").replace(
        "name: scripted}}]", "name: scripted}, tools: [data_put], data_stores: [notes]}]"
    )
    await apply_and_start(instance.pool, spec)
    async with instance.pool.connection() as conn:  # the database refuses this one record
        await conn.execute("ALTER TABLE data_records ADD CONSTRAINT no_secret_rows "
                           "CHECK (value::text NOT LIKE '%%hunter2%%')")  # fmt: skip
    caller = dataclasses.replace(instance, name=name)
    args = json.dumps({"store": "notes", "key": "pin", "value": "my pin is hunter2"})
    reply = await caller.reply(await caller.chat(f"keep this\ncall: data_put {args}"), timeout=60)
    told = [m for m in await transcript(instance.pool, employee=name) if m["role"] == "tool"]
    assert [json.loads(m["content"]) for m in told] == [
        {"error": "the tool failed: the database refused the call's data"}
    ]
    for text in (reply, told[0]["content"]):
        assert "no_secret_rows" not in text and "Failing row" not in text
        assert "violates" not in text and "23514" not in text
    # A transactional call's record rolls back with its refused write: nothing half-done.
    assert await query(instance.pool, "SELECT key FROM data_records") == []
    # The timeline says the call failed and why (issue 26): category and type, never the row.
    q = "SELECT detail FROM employee_timeline WHERE employee = %s AND kind = 'tool.failed'"
    (entry,) = await query(instance.pool, q, name)
    assert entry["detail"]["tool"] == "data_put"
    assert entry["detail"]["error"] == "invalid_request: ToolDataRefused: " + (
        "the database refused the call's data"
    )
    # The operator's log names the cause's category and type (issue 26), never the row.
    logged = [r.getMessage() for r in caplog.records if r.name == "eventos.tools.activity"]
    assert logged and all(": invalid_request: CheckViolation (SQLSTATE 23514)" in m for m in logged)
