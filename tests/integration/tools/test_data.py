"""Watched data on real PostgreSQL (SPEC §10, §15, §17): the data tools through the tool runner
(stores allowed per agent, bounds refused), each write's `data.<store>.changed` event in the
write's transaction, and the router's level-triggered coalescing: one pending input per
(subscription, record), no self-wake, past 200 pending records one resync."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from conftest import apply_and_start
from psycopg_pool import AsyncConnectionPool
from test_router import query, route_until_done

from eventos import names
from eventos.contracts import ToolCallInput
from eventos.db import Conn
from eventos.employees import lifecycle
from eventos.settings import SecretStore
from eventos.tools import data
from eventos.tools.runner import ToolRunner


def spec(name: str, *, tools: str, stores: str = "[]", triggers: str = "") -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents:
    - name: front
      model: {{provider: local, name: scripted}}
      tools: {tools}
      data_stores: {stores}
  triggers:
    - {{kind: chat}}
{triggers}"""


WATCH_PRICES = "    - {kind: watch, store: prices}\n"


@pytest.fixture
async def writer(pool: AsyncConnectionPool[Conn]) -> str:
    """An employee that may read and write store `prices` and read `stock` (it watches it)."""
    name = f"w{uuid.uuid4().hex[:8]}"
    triggers = "    - {kind: watch, store: stock}\n"
    await apply_and_start(pool, spec(name, tools="[data_get, data_put, data_list]",
                                     stores="[prices]", triggers=triggers))  # fmt: skip
    return name


async def watcher(pool: AsyncConnectionPool[Conn], store: str = "prices") -> str:
    name = f"v{uuid.uuid4().hex[:8]}"
    triggers = f"    - {{kind: watch, store: {store}}}\n"
    await apply_and_start(pool, spec(name, tools="[data_get, data_list]", triggers=triggers))
    return name


def call(employee: str, name: str, args: dict[str, Any] | str, *, hop: int = 0,
         path: list[str] | None = None, call_id: str | None = None) -> ToolCallInput:  # fmt: skip
    text = args if isinstance(args, str) else json.dumps(args)
    turn = f"turn-conv-{employee}-g1-talk-main-1"
    return ToolCallInput(employee, 1, "front", "main", "talk", f"{employee}/g1/talk/main", turn,
                         call_id or f"call_{uuid.uuid4().hex[:12]}", name, text, 1,
                         {"kind": "chat"}, "chain-1", hop, path or [])  # fmt: skip


async def run(pool: AsyncConnectionPool[Conn], c: ToolCallInput) -> tuple[str, dict[str, Any]]:
    result = await ToolRunner(pool, SecretStore(env={})).run(c)
    return result.outcome, json.loads(result.content)


async def put(pool: AsyncConnectionPool[Conn], writer: str, key: str, value: Any,
              store: str = "prices") -> int:  # fmt: skip
    """A write through the data layer, as a tool call's transaction makes it."""
    async with pool.connection() as conn:
        return await data.write(conn, data.Write(store, key, value, writer, chain_id="chain-x"))


async def test_put_get_list_read_back_what_was_written(
    pool: AsyncConnectionPool[Conn], writer: str
) -> None:
    assert await run(pool, call(writer, "data_get", {"store": "prices", "key": "sku-1"})) == (
        names.TOOL_OK, {"value": None, "version": 0})  # fmt: skip
    for version, eur in ((1, 10), (2, 12)):
        args = {"store": "prices", "key": "sku-1", "value": {"eur": eur}}
        assert await run(pool, call(writer, "data_put", args)) == (names.TOOL_OK,
                                                                   {"version": version})  # fmt: skip
    assert await run(pool, call(writer, "data_get", {"store": "prices", "key": "sku-1"})) == (
        names.TOOL_OK, {"value": {"eur": 12}, "version": 2})  # fmt: skip
    (rec,) = await query(pool, "SELECT updated_by FROM data_records")
    assert rec["updated_by"] == writer
    for i in range(205):
        await put(pool, writer, f"a/{i:03d}", i)
    await put(pool, writer, "b/1", "x")
    outcome, listed = await run(
        pool, call(writer, "data_list", {"store": "prices", "prefix": "a/"})
    )
    assert outcome == names.TOOL_OK and listed["more"] is True
    assert listed["keys"] == [f"a/{i:03d}" for i in range(200)]
    args = {"store": "prices", "prefix": "a/", "after": "a/199"}
    assert await run(pool, call(writer, "data_list", args)) == (names.TOOL_OK, {
        "keys": ["a/200", "a/201", "a/202", "a/203", "a/204"], "more": False})  # fmt: skip
    assert (await run(pool, call(writer, "data_list", {"store": "stock"})))[1] == {
        "keys": [], "more": False}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "args", "fragment"),
    [
        ("data_get", {"store": "Bad.Store", "key": "k"}, "invalid arguments at store"),
        ("data_put", {"store": "prices", "key": "../etc", "value": 1}, "invalid arguments at key"),
        (
            "data_put",
            {"store": "stock", "key": "k", "value": 1},
            "store 'stock' may not be written by this agent (allowed: prices)",
        ),
        ("data_get", {"store": "secrets", "key": "k"}, "store 'secrets' may not be read"),
        ("data_list", {"store": "secrets"}, "(allowed: prices, stock)"),
        ("data_put", {"store": "prices", "key": "k", "value": "x" * 70_000}, "arguments over"),
    ],
)
async def test_bad_stores_names_and_values_are_refused(
    pool: AsyncConnectionPool[Conn], writer: str, name: str, args: dict[str, Any], fragment: str
) -> None:
    outcome, result = await run(pool, call(writer, name, args))
    assert outcome == names.TOOL_REFUSED and fragment in result["error"], result
    assert await query(pool, "SELECT 1 FROM data_records") == []
    assert await query(pool, "SELECT 1 FROM bus_ingress") == []


async def test_the_data_layer_refuses_a_value_or_a_key_past_its_bound(
    pool: AsyncConnectionPool[Conn], writer: str
) -> None:
    with pytest.raises(data.DataRefused, match="over 65536"):
        await put(pool, writer, "big", "é" * 40_000)  # 80,002 bytes as stored
    await put(pool, writer, "k-0", 0)
    await query(pool, "UPDATE data_stores SET keys = %s RETURNING 1", names.DATA_KEYS_PER_STORE)
    assert await put(pool, writer, "k-0", 1) == 2  # an existing key may still change
    args = {"store": "prices", "key": "k-new", "value": 1}
    outcome, result = await run(pool, call(writer, "data_put", args))
    assert outcome == names.TOOL_REFUSED
    assert result == {"error": "store 'prices' holds 10000 keys, its bound"}
    rows = await query(pool, "SELECT key FROM data_records ORDER BY key")
    assert rows == [{"key": "k-0"}]  # the refusal undid the write and its event
    assert len(await query(pool, "SELECT 1 FROM bus_ingress")) == 2


async def test_a_write_appends_its_change_event_with_the_causal_context(
    pool: AsyncConnectionPool[Conn], writer: str
) -> None:
    args = {"store": "prices", "key": "sku-9", "value": [1, 2]}
    c = call(writer, "data_put", args, hop=2, path=["boss"], call_id="call_fixed")
    assert await run(pool, c) == (names.TOOL_OK, {"version": 1})
    assert await run(pool, c) == (names.TOOL_OK, {"version": 1})  # a retried attempt: no 2nd write
    (row,) = await query(pool, "SELECT source_key, type, class, chain_id, hop, causation_id, "
                               "envelope FROM bus_ingress")  # fmt: skip
    assert (row["source_key"], row["type"], row["class"]) == ("watch:prices",
                                                              "data.prices.changed", 4)  # fmt: skip
    assert (row["chain_id"], row["hop"], row["causation_id"]) == ("chain-1", 3, c.key)
    env = row["envelope"]
    assert env[names.ATTR_PATH] == ["boss", writer]
    assert {k: env["data"][k] for k in ("store", "key", "version", "writer")} == {
        "store": "prices", "key": "sku-9", "version": 1, "writer": writer}  # fmt: skip
    assert 'call: data_get {"store":"prices","key":"sku-9"}' in env["data"]["text"]
    assert "[1, 2]" not in env["data"]["text"]  # level-triggered: the key, not the value


async def deliveries(pool: AsyncConnectionPool[Conn], employee: str) -> list[dict[str, Any]]:
    return await query(pool, "SELECT d.type, d.payload, d.status FROM bus_deliveries d "
                             "JOIN bus_streams s USING (stream_key) WHERE s.employee = %s "
                             "ORDER BY d.seq", employee)  # fmt: skip


async def notes(pool: AsyncConnectionPool[Conn]) -> list[tuple[str, str | None]]:
    rows = await query(pool, "SELECT status, error FROM bus_ingress ORDER BY id")
    return [(r["status"], r["error"]) for r in rows]


async def test_changes_to_a_pending_record_coalesce_and_the_writer_is_not_woken(
    pool: AsyncConnectionPool[Conn], writer: str
) -> None:
    reader = await watcher(pool, "stock")
    for i in range(5):
        await put(pool, writer, "sku-1", i, store="stock")
    await put(pool, writer, "sku-2", 0, store="stock")
    await route_until_done(pool)
    got = await deliveries(pool, reader)
    assert [(d["type"], d["payload"]["data"]["key"]) for d in got] == [
        ("data.stock.changed", "sku-1"), ("data.stock.changed", "sku-2")]  # fmt: skip
    assert await deliveries(pool, writer) == []  # it watches `stock` too, but wrote these
    status = await notes(pool)
    assert status[0] == (names.INGRESS_ROUTED, f"self_wake_skipped: {writer}/watch-1 wrote it")
    for st, error in status[1:5]:
        assert st == names.INGRESS_ROUTED and error is not None
        assert f"coalesced: {reader}/watch-1 into " in error
    (pending,) = await query(pool, "SELECT coalesced, last_version FROM watch_pending "
                                   "WHERE subject = 'sku-1'")  # fmt: skip
    assert pending == {"coalesced": 4, "last_version": 5}

    await query(pool, "UPDATE bus_deliveries SET status = 'delivered' RETURNING 1")
    await put(pool, writer, "sku-1", 99, store="stock")  # the input was sent: a new one
    await route_until_done(pool)
    assert [d["payload"]["data"]["version"] for d in await deliveries(pool, reader)] == [1, 1, 6]


async def test_only_the_writer_watching_is_no_consumer_with_its_reason(
    pool: AsyncConnectionPool[Conn], writer: str
) -> None:
    await put(pool, writer, "sku-1", 1, store="stock")
    await route_until_done(pool)
    assert await notes(pool) == [(names.INGRESS_NO_CONSUMER,
                                  f"self_wake_skipped: {writer}/watch-1 wrote it")]  # fmt: skip


async def test_past_200_pending_records_further_changes_become_one_resync(
    pool: AsyncConnectionPool[Conn], writer: str
) -> None:
    reader = await watcher(pool)
    async with pool.connection() as conn:
        await lifecycle.stop(conn, reader)  # nothing is sent: every input stays pending
    for i in range(230):
        await put(pool, writer, f"sku-{i:03d}", i)
    await put(pool, writer, "sku-000", "again")  # still pending: coalesced, not a resync
    await route_until_done(pool)
    got = await deliveries(pool, reader)
    assert len(got) == names.WATCH_SUBJECTS_MAX + 1
    assert {d["type"] for d in got[:200]} == {"data.prices.changed"}
    resync = got[200]
    assert resync["type"] == "data.prices.resync"
    assert resync["payload"]["data"]["pending"] == 200
    assert 'call: data_list {"store":"prices"}' in resync["payload"]["data"]["text"]
    status = await notes(pool)
    assert status[200][1] is not None and status[200][1].startswith(
        f"resync: {reader}/watch-1 has 200"
    )
    assert all("into the resync" in str(e) for _, e in status[201:230])
    assert "into the resync" not in str(status[230][1])  # sku-000's own input took it
    assert {s for s, _ in status} == {names.INGRESS_ROUTED}

    # The backlog drains (the inputs were sent): changes are inputs of their own again.
    await query(pool, "UPDATE bus_deliveries SET status = 'delivered' RETURNING 1")
    await put(pool, writer, "sku-500", 1)
    await route_until_done(pool)
    last = (await deliveries(pool, reader))[-1]
    assert (last["type"], last["payload"]["data"]["key"]) == ("data.prices.changed", "sku-500")
