"""Routing (SPEC §8 step 2): accepted ingress rows become deliveries in numbered streams.

One transaction per batch of one source, under a per-source advisory lock, so several routers
can run at once without routing a row twice or out of per-source order. Re-running after a
crash is a no-op: rows already routed are no longer `accepted`.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from eventos import names, users
from eventos.db import Conn
from eventos.db.sql import Q

log = logging.getLogger(__name__)

ROUTE_BATCH = 100
SOURCES_PER_PASS = 50


class FilterError(Exception):
    """A subscription filter could not be evaluated against an event."""


@dataclass
class RouteStats:
    """What one routing pass did."""

    routed: int = 0
    no_consumer: int = 0
    dead: int = 0
    deliveries: int = 0
    busy_sources: int = 0
    streams: set[str] = field(default_factory=set)

    @property
    def rows(self) -> int:
        return self.routed + self.no_consumer + self.dead


def lookup(doc: object, path: str) -> object:
    """The value at a dotted path; None when a key is missing; FilterError on a non-object."""
    value = doc
    for part in path.split("."):
        if value is None:
            return None
        if not isinstance(value, dict):
            raise FilterError(f"{path}: {part!r} is not inside an object")
        value = value.get(part)
    return value


def filter_matches(flt: dict[str, Any], envelope: object) -> bool:
    """Every `path: expected` pair holds; a list means any of its values."""
    for path, expected in flt.items():
        value = lookup(envelope, path)
        allowed = expected if isinstance(expected, list) else [expected]
        if value not in allowed:
            return False
    return True


def type_matches(types: list[str], event_type: str) -> bool:
    """`*` matches any type; `prefix.*` matches a family."""
    for t in types:
        if t == "*" or t == event_type or (t.endswith(".*") and event_type.startswith(t[:-1])):
            return True
    return False


def thread_for(thread_by: str | None, envelope: object, ingress_id: int) -> str:
    """`main`, `e_<event>` (ephemeral) or `t_<hash>` of the counterpart (no personal data)."""
    if not thread_by:
        return names.THREAD_MAIN
    if thread_by == "event":
        return f"e_{ingress_id}"
    try:
        value = lookup(envelope, thread_by)
    except FilterError:
        value = None
    if value is None or value == "":
        return names.THREAD_MAIN
    return "t_" + hashlib.sha256(str(value).encode()).hexdigest()[:16]


TICK_KINDS = ("cron", "poll", "start")


def chat_audience(sub: dict[str, Any], envelope: object) -> str | None:
    """Whose owner chat an event is: the chat envelope's audience (`owner`, the admin, when
    none); None for any other trigger. Only the owner API writes `chat:*` sources."""
    if sub["trigger_kind"] != "chat":
        return None
    audience = lookup(envelope, "data.audience") if isinstance(envelope, dict) else None
    return str(audience or users.OWNER)


def thread_of(sub: dict[str, Any], envelope: object, ingress_id: int) -> str:
    """The event's thread: a user's chat is always its own thread (EG3, EG17); everything else,
    the admin's chat included, as the trigger's `thread_by` says."""
    audience = chat_audience(sub, envelope)
    if audience is not None and audience != users.OWNER:
        return users.thread_of(audience)
    return thread_for(sub["thread_by"], envelope, ingress_id)


def entity_id(employee: str, generation: int, lane: str, thread: str) -> str:
    """The ConversationWorkflow id of a stream (SPEC §7)."""
    return f"conv-{employee}-g{generation}-{lane}-{thread}"


def _route_of(sub: dict[str, Any], envelope: object, thread: str) -> dict[str, Any]:
    route: dict[str, Any] = {"trigger": sub["trigger_name"], "kind": sub["trigger_kind"]}
    route["agent"] = sub["agent"]
    route["thread"] = thread
    route["reply"] = bool(sub["reply_capable"])
    if sub.get("debounce"):
        route["debounce"] = sub["debounce"]  # the trigger's own window and cap
    if sub["trigger_kind"] in TICK_KINDS:
        route["on_busy"] = sub["on_busy"]  # a tick while this trigger's turn runs (SPEC §10)
    if sub["trigger_kind"] == "chat":
        session = lookup(envelope, "subject") if isinstance(envelope, dict) else None
        route["session"] = str(session or "owner")
        route["audience"] = chat_audience(sub, envelope)
    grouped = isinstance(envelope, dict) and envelope.get(names.GROUP_ATTRIBUTE) == names.GROUP_CHAT
    if sub["trigger_kind"] in names.CHANNEL_KINDS and grouped:
        route["group"] = True  # a customer group: its own debounce (SPEC §8)
    return route


async def _deliver(conn: Conn, row: dict[str, Any], sub: dict[str, Any], stats: RouteStats) -> None:
    envelope = row["envelope"]
    thread = thread_of(sub, envelope, int(row["id"]))
    key = names.stream_key(sub["employee"], sub["generation"], sub["lane"], thread)
    hold = names.HOLD_STARTING if sub["generation_state"] == names.GEN_STARTING else None
    if sub["generation_state"] == names.GEN_PAUSED:
        hold = names.HOLD_PAUSED
    cur = await conn.execute(
        Q["stream_allocate_seq"],
        {
            "stream_key": key,
            "employee": sub["employee"],
            "generation": sub["generation"],
            "lane": sub["lane"],
            "thread": thread,
            "hold_reason": hold,
            "entity_id": entity_id(sub["employee"], sub["generation"], sub["lane"], thread),
            "class": sub["class"],
        },
    )
    seq = int((await cur.fetchone() or {})["seq"])
    await conn.execute(
        Q["delivery_insert"],
        {
            "stream_key": key,
            "seq": seq,
            "ingress_id": row["id"],
            "ingress_received_at": row["received_at"],
            "subscription_id": sub["id"],
            "route": Jsonb(_route_of(sub, envelope, thread)),
            "class": sub["class"],
            "thread": thread,
            "type": row["type"],
            "payload": Jsonb(envelope) if envelope is not None else None,
            "body_ref": row["body_ref"],
            "size": row["size"],
            "chain_id": row["chain_id"],
            "hop": row["hop"],
            "causation_id": row["causation_id"],
        },
    )
    stats.deliveries += 1
    stats.streams.add(key)


async def _route_row(
    conn: Conn, row: dict[str, Any], subs: list[dict[str, Any]], stats: RouteStats
) -> None:
    status, error = names.INGRESS_NO_CONSUMER, None
    matched: list[dict[str, Any]] = []
    try:
        for sub in subs:
            if type_matches(list(sub["event_types"]), str(row["type"])) and filter_matches(
                sub["filter"], row["envelope"]
            ):
                matched.append(sub)
    except FilterError as exc:
        status, error, matched = names.INGRESS_DEAD, f"filter_error: {exc}", []
    if len(matched) > names.FANOUT_MAX:
        error = f"fanout_capped: {len(matched)} subscriptions, first {names.FANOUT_MAX} served"
        matched = matched[: names.FANOUT_MAX]
    for sub in matched:
        await _deliver(conn, row, sub, stats)
    if matched:
        status = names.INGRESS_ROUTED
    params = {"id": row["id"], "received_at": row["received_at"], "status": status, "error": error}
    await conn.execute(Q["ingress_mark"], params)
    if status == names.INGRESS_ROUTED:
        stats.routed += 1
    elif status == names.INGRESS_DEAD:
        stats.dead += 1
    else:
        stats.no_consumer += 1


async def route_source(conn: Conn, source: str, stats: RouteStats, limit: int = ROUTE_BATCH) -> int:
    """Route the next accepted rows of one source in one transaction; 0 if another router has it."""
    async with conn.transaction():
        cur = await conn.execute(Q["ingress_source_lock"], {"source_key": source})
        if not (await cur.fetchone() or {}).get("locked"):
            stats.busy_sources += 1  # another router holds this source right now
            return 0
        cur = await conn.execute(
            Q["ingress_next_for_source"], {"source_key": source, "limit": limit}
        )
        rows = await cur.fetchall()
        if not rows:
            return 0
        cur = await conn.execute(Q["subscriptions_for_source"], {"source_key": source})
        subs = await cur.fetchall()
        for row in rows:
            await _route_row(conn, row, subs, stats)
    return len(rows)


async def route_pass(conn: Conn, *, sources: int = SOURCES_PER_PASS) -> RouteStats:
    """One pass over the sources with accepted rows."""
    stats = RouteStats()
    cur = await conn.execute(Q["ingress_sources_pending"], {"limit": sources})
    pending = [str(r["source_key"]) for r in await cur.fetchall()]
    await conn.commit()
    for source in pending:
        await route_source(conn, source, stats)
    return stats
