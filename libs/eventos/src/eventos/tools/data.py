"""Watched data (SPEC §10, §17): named stores shared by the instance's employees, the data
layer and the tools `data_get`, `data_put`, `data_list`.

A write and its `data.<store>.changed` event (source `watch:<store>`, the source a `watch`
trigger with that store listens to) commit in one transaction, so a watcher never misses a
write and never hears of one that did not happen. The event says which key changed and its
version, not the value: the watcher reads the current value (level-triggered), and the router
coalesces changes to a record whose input is still pending (`eventos.delivery.watch`).

Bounds (I3): store names `[a-z][a-z0-9-]{0,39}`, keys `[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}`,
a value's compact JSON ≤ 64 KiB, 10,000 keys per store (a write adding one more is refused),
`data_list` answers 200 keys at a time with `more`. Keys are never deleted.

An agent reads the stores in its `data_stores` and those its employee's `watch` triggers
watch, and writes only those in its `data_stores`; any other store is refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from eventos import names
from eventos.bus.envelope import encoded_size, new_event_id
from eventos.bus.inbox import IngressRecord, append
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.spec.model import Agent, EmployeeSpec
from eventos.tools.base import Effect, Tool, ToolContext, ToolRefused, obj


class DataRefused(ToolRefused):
    """The data layer refuses the operation (a bad name, a value or a store past its bound)."""


@dataclass(frozen=True)
class Write:
    """One write and the causal context its event carries on (I8)."""

    store: str
    key: str
    value: Any
    writer: str  # the employee; its own watch triggers are not woken by this write
    chain_id: str
    hop: int = 1
    causation_id: str | None = None
    path: list[str] = field(default_factory=list)


def check_names(store: str, key: str | None = None) -> None:
    """DataRefused unless the store (and key) names have the allowed shape."""
    if not re.match(names.DATA_STORE_RE, store):
        raise DataRefused(f"store {store!r} is not a store name ({names.DATA_STORE_RE})")
    if key is not None and not re.match(names.DATA_KEY_RE, key):
        raise DataRefused(f"key {key!r} is not a key ({names.DATA_KEY_RE})")


def value_size(value: Any) -> int:
    """A value's size as stored: compact JSON, UTF-8 bytes."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


async def read(conn: Conn, store: str, key: str) -> tuple[Any, int]:
    """A record's value and version; (None, 0) for a key never written."""
    check_names(store, key)
    cur = await conn.execute(Q["data_record_get"], {"store": store, "key": key})
    row = await cur.fetchone()
    return (row["value"], int(row["version"])) if row else (None, 0)


async def list_keys(conn: Conn, store: str, prefix: str = "",
                    after: str = "") -> tuple[list[str], bool]:  # fmt: skip
    """The first DATA_LIST_MAX keys (bytewise order) under `prefix` and after `after`, and
    whether there are more."""
    check_names(store)
    params = {"store": store, "prefix": prefix, "after": after, "limit": names.DATA_LIST_MAX + 1}
    cur = await conn.execute(Q["data_keys_list"], params)
    keys = [str(r["key"]) for r in await cur.fetchall()]
    return keys[: names.DATA_LIST_MAX], len(keys) > names.DATA_LIST_MAX


async def write(conn: Conn, w: Write) -> int:
    """Write a record and append its change event in one transaction; the new version."""
    check_names(w.store, w.key)
    size = value_size(w.value)
    if size > names.DATA_VALUE_MAX_BYTES:
        raise DataRefused(f"value is {size} bytes, over {names.DATA_VALUE_MAX_BYTES}")
    async with conn.transaction():  # a savepoint inside a tool call: a refusal undoes it all
        params = {"store": w.store, "key": w.key, "value": Jsonb(w.value), "writer": w.writer}
        cur = await conn.execute(Q["data_record_put"], params)
        row = await cur.fetchone() or {}
        if row["created"]:
            cur = await conn.execute(Q["data_store_count_key"], {"store": w.store})
            keys = int((await cur.fetchone() or {})["keys"])
            if keys > names.DATA_KEYS_PER_STORE:
                raise DataRefused(
                    f"store {w.store!r} holds {names.DATA_KEYS_PER_STORE} keys, its bound"
                )
        version = int(row["version"])
        await append(conn, [change_record(w, version)])
    return version


def change_text(store: str, key: str, writer: str) -> str:
    """What the watcher's model reads: which record changed and how to read it (not the
    value: it reads the current one, whatever happened since)."""
    args = json.dumps({"store": store, "key": key}, separators=(",", ":"))
    return (f"[data changed] store {store}, key {key} (written by {writer}). "
            f"Read its current value:\ncall: data_get {args}")  # fmt: skip


def change_record(w: Write, version: int) -> IngressRecord:
    """The `data.<store>.changed` event of one write, on source `watch:<store>` (C4)."""
    event_id = new_event_id()
    event_type = names.data_changed_type(w.store)
    path = w.path if w.writer in w.path else [*w.path, w.writer]
    data = {"store": w.store, "key": w.key, "version": version, "writer": w.writer,
            "text": change_text(w.store, w.key, w.writer)}  # fmt: skip
    envelope = {
        "specversion": "1.0", "id": event_id, "source": f"/data/{w.store}", "type": event_type,
        "subject": w.key, "datacontenttype": "application/json", "data": data,
        names.ATTR_PATH: path[-names.STORM_PATH_MAX :],
    }  # fmt: skip
    return IngressRecord(
        source_key=names.source_key(names.SOURCE_WATCH, w.store),
        dedupe_key=f"{w.store}/{w.key}/{version}", type=event_type, chain_id=w.chain_id,
        envelope=envelope, size=encoded_size(envelope), klass=names.C4_BACKGROUND,
        hop=w.hop, causation_id=w.causation_id,
    )  # fmt: skip


def readable_stores(spec: EmployeeSpec, agent: Agent) -> set[str]:
    """The stores an agent may read: its `data_stores`, and those its employee watches."""
    watched = {str(t.store) for t in spec.spec.triggers if t.kind == "watch" and t.store}
    return set(agent.data_stores) | watched


def store_of(ctx: ToolContext, args: dict[str, Any], *, writes: bool = False) -> str:
    """The call's store, if the agent may use it so (ToolRefused otherwise): it reads its
    `data_stores` and the stores its employee watches, and writes only its `data_stores`."""
    store = str(args["store"])
    check_names(store)
    allowed = set(ctx.agent.data_stores) if writes else readable_stores(ctx.spec, ctx.agent)
    if store not in allowed:
        shown = ", ".join(sorted(allowed)) or "none"
        verb = "written" if writes else "read"
        raise ToolRefused(f"store {store!r} may not be {verb} by this agent (allowed: {shown})")
    return store


async def _get(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    value, version = await read(ctx.conn, store_of(ctx, args), str(args["key"]))
    return {"value": value, "version": version}


async def _put(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    call, store = ctx.call, store_of(ctx, args, writes=True)
    w = Write(store, str(args["key"]), args["value"], writer=call.employee,
              chain_id=call.chain_id, hop=call.hop + 1, causation_id=call.key,
              path=list(call.path))  # fmt: skip
    return {"version": await write(ctx.conn, w)}


async def _list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    store, prefix, after = store_of(ctx, args), args.get("prefix") or "", args.get("after") or ""
    keys, more = await list_keys(ctx.conn, store, str(prefix), str(after))
    return {"keys": keys, "more": more}


STORE = {"type": "string", "pattern": names.DATA_STORE_RE, "description": "The store's name."}
KEY = {"type": "string", "pattern": names.DATA_KEY_RE, "description": "The record's key."}
PAGE = {"type": "string", "maxLength": 200}
ANY = {"description": "Any JSON value."}
GET_DOC = ("Read one record of a shared store: its JSON value and version (a key never written "
           "reads as value null, version 0).")  # fmt: skip
PUT_DOC = ("Write one record of a shared store (any JSON value up to 64 KiB); answers the new "
           "version. Employees watching the store are told which key changed.")  # fmt: skip
LIST_DOC = (f"List the keys of a shared store in order, optionally under a prefix: the first "
            f"{names.DATA_LIST_MAX} (after `after`, to page on), and `more` when there are "
            "others.")  # fmt: skip

TOOLS: list[Tool] = [
    Tool(
        "data_get",
        GET_DOC,
        obj({"store": STORE, "key": KEY}, ["store", "key"]),
        _get,
        Effect.READ_ONLY,
        transactional=True,
    ),
    Tool(
        "data_put",
        PUT_DOC,
        obj({"store": STORE, "key": KEY, "value": ANY}, ["store", "key", "value"]),
        _put,
        Effect.IDEMPOTENT,
        transactional=True,
    ),
    Tool(
        "data_list",
        LIST_DOC,
        obj({"store": STORE, "prefix": PAGE, "after": PAGE}, ["store"]),
        _list,
        Effect.READ_ONLY,
        transactional=True,
    ),
]
