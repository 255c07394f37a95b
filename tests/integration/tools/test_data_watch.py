"""Watched data through the whole path in one process, on the real dev server and PostgreSQL:
a turn's `data_put` wakes the store's watchers (not the writer), whose turns read the record with
`data_get`; 1,000 writes to one record coalesce into a few inputs, and the last read sees the
last version (level-triggered, SPEC §10, §15)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from conftest import apply_and_start
from test_data import spec
from test_router import query
from test_turns import Instance, instance  # noqa: F401 (the in-process stack fixture)

from eventos import names
from eventos.testing import wait_for
from eventos.tools import data

pytestmark = pytest.mark.temporal

WRITES = 1000
BATCH = 100  # writes per transaction, as a busy writer's would land


async def employees_of(instance: Instance) -> tuple[str, str]:  # noqa: F811
    """A writer (which also watches `prices`) and a watcher of `prices`."""
    writer, watcher = f"w{uuid.uuid4().hex[:8]}", f"v{uuid.uuid4().hex[:8]}"
    watch = "    - {kind: watch, store: prices}\n"
    await apply_and_start(instance.pool, spec(writer, tools="[data_put, data_get]",
                                              stores="[prices]", triggers=watch))  # fmt: skip
    await apply_and_start(instance.pool, spec(watcher, tools="[data_get, data_list]",
                                              triggers=watch))  # fmt: skip
    return writer, watcher


async def reads(instance: Instance, employee: str) -> list[dict[str, Any]]:  # noqa: F811
    """The results of an employee's finished `data_get` calls, oldest first."""
    rows = await query(instance.pool, "SELECT result FROM tool_calls WHERE employee = %s AND "
                                      "name = 'data_get' AND status = 'done' ORDER BY created_at",
                       employee)  # fmt: skip
    return [json.loads(r["result"]) for r in rows]


async def inputs(instance: Instance, employee: str) -> list[dict[str, Any]]:  # noqa: F811
    return await query(instance.pool, "SELECT d.type, d.status FROM bus_deliveries d JOIN "
                                      "bus_streams s USING (stream_key) WHERE s.employee = %s "
                                      "ORDER BY d.seq", employee)  # fmt: skip


async def test_a_turns_write_wakes_the_watcher_which_reads_it_and_not_the_writer(
    instance: Instance,  # noqa: F811 (the fixture imported above)
) -> None:
    writer, watcher = await employees_of(instance)
    args = {"store": "prices", "key": "sku-1", "value": {"eur": 10}}
    r = await instance.api.post(f"/v1/employees/{writer}/chat", json={
        "client_message_id": uuid.uuid4().hex, "text": f"set it\ncall: data_put {json.dumps(args)}",
    })  # fmt: skip
    reply = await instance.reply(int(r.json()["message_id"]), name=writer)
    assert 'data_put returned {"version":1}' in reply

    read = await wait_for(lambda: reads(instance, watcher), timeout=60, what="the watcher's read")
    assert read == [{"value": {"eur": 10}, "version": 1}]
    assert [i["type"] for i in await inputs(instance, watcher)] == ["data.prices.changed"]
    assert all(i["type"] == names.TYPE_CHAT_MESSAGE for i in await inputs(instance, writer))
    (change,) = await query(instance.pool, "SELECT status, error, chain_id, hop FROM bus_ingress "
                                           "WHERE source_key = 'watch:prices'")  # fmt: skip
    assert change["status"] == names.INGRESS_ROUTED
    assert change["error"] == f"self_wake_skipped: {writer}/watch-1 wrote it"
    assert change["hop"] == 1  # one hop past the owner's message


async def test_a_thousand_writes_to_one_record_make_few_inputs_that_read_the_latest(
    instance: Instance,  # noqa: F811 (the fixture imported above)
) -> None:
    writer, watcher = await employees_of(instance)
    async with instance.pool.connection() as conn:
        for start in range(0, WRITES, BATCH):
            async with conn.transaction():
                for n in range(start, start + BATCH):
                    w = data.Write("prices", "sku-1", {"eur": n}, writer, chain_id=f"c-{n}")
                    assert await data.write(conn, w) == n + 1

    async def read_last() -> bool:
        got = await reads(instance, watcher)
        return bool(got) and got[-1]["version"] == WRITES

    await wait_for(read_last, timeout=90, what="the watcher's read of the last version")

    async def settled() -> list[dict[str, Any]] | None:
        routing = await query(instance.pool, "SELECT 1 FROM bus_ingress WHERE status = "
                                             "'accepted' AND source_key = 'watch:prices'")  # fmt: skip
        got = await inputs(instance, watcher)
        return None if routing or any(i["status"] != "done" for i in got) else got

    got = await wait_for(settled, timeout=60, what="every change routed, every input consumed")
    assert 1 <= len(got) <= 2 * WRITES // BATCH, got  # about one per routing pass, not 1,000
    assert {i["type"] for i in got} == {"data.prices.changed"}
    assert await inputs(instance, writer) == []  # the writer watches too, but wrote them all
    final = await reads(instance, watcher)
    assert final[-1] == {"value": {"eur": WRITES - 1}, "version": WRITES}
    assert len(final) <= len(got)  # one read per turn at most: the turns batch their inputs
    rows = await query(instance.pool, "SELECT error FROM bus_ingress "
                                      "WHERE source_key = 'watch:prices'")  # fmt: skip
    coalesced = [r for r in rows if f"coalesced: {watcher}/watch-1 into" in str(r["error"])]
    assert len(rows) == WRITES and len(coalesced) == WRITES - len(got)
