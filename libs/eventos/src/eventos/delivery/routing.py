"""Routing (SPEC §8 step 2): accepted ingress rows become deliveries in numbered streams.

A pass is one transaction over the next rows of up to 50 sources, each under a per-source
advisory lock, so several routers can run at once without routing a row twice or out of
per-source order. Python matches the rows to subscriptions and places them; one statement per
batch (`Batch`) then takes every touched stream's seqs, writes the deliveries with the payload
copied inside the database, and marks the rows. Rows the storm guards or watch coalescing decide
on are routed one by one, in their place. Re-running after a crash is a no-op: rows already
routed are no longer `accepted`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb

from eventos import names
from eventos.alarms.store import cancel_follow_ups
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.delivery import watch
from eventos.messaging import ipc, storm
from eventos.owner import users

log = logging.getLogger(__name__)

# Rows one pass routes at most, shared by the sources it locked: one busy source gets them all,
# 50 get 40 each; a pass stays well within the statement timeout and holds its streams briefly.
ROWS_PER_PASS = 2000
ONE_BY_ONE_PER_PASS = 100  # of a source whose rows may take several statements each
SOURCES_PER_PASS = 50


class FilterError(Exception):
    """A subscription filter could not be evaluated against an event."""


class PlacementError(Exception):
    """An internal event names a stream or a route that cannot be."""


LANES = (names.LANE_TALK, names.LANE_CUSTOMER, names.LANE_WORKER)
# Threads an internal producer may name (SPEC §3): main, a customer's, a user's owner chat,
# one conversation of another employee (`names.peer_thread`; the bare `peer_<sender>` of
# rows written before issue 25 still routes), an ephemeral one.
PLACED_THREAD = re.compile(
    r"^(main|t_[0-9a-f]{16}|u_[0-9a-f]{16}|e_[0-9]{1,20}"
    rf"|peer_[a-z][a-z0-9-]{{0,39}}(_[0-9a-f]{{{names.PEER_ORIGIN_HEX}}})?)$"
)


@dataclass(frozen=True)
class Placement:
    """Where a delivery goes: its lane, thread and reply route."""

    lane: str
    thread: str
    route: dict[str, Any]
    klass: int | None = None  # the delivery's class when not its subscription's (a user's chat)


def placed(sub: dict[str, Any], envelope: object) -> Placement:
    """An implicit subscription's event names its stream and reply route itself (alarms fire
    into the thread that set them and take its route; task results go to the origin thread;
    messages from another employee to `peer_<sender>_<origin>`). Only internal producers write these
    sources (SPEC §6.3), so the names are checked for shape, not for trust."""
    env = envelope if isinstance(envelope, dict) else {}
    lane, thread = env.get(names.ATTR_LANE, names.LANE_WORKER), env.get(names.ATTR_THREAD)
    route = env.get(names.ATTR_ROUTE) or {}
    if lane not in LANES:
        raise PlacementError(f"lane {lane!r} is not a lane")
    if not isinstance(thread, str) or not PLACED_THREAD.match(thread):
        raise PlacementError(f"thread {thread!r} is not a thread")
    if not isinstance(route, dict):
        raise PlacementError("the route must be an object")
    route = {**route, "agent": route.get("agent") or sub["agent"], "thread": thread}
    route.setdefault("kind", sub["trigger_kind"])
    route.setdefault("trigger", sub["trigger_name"])
    route.setdefault("reply", False)
    if thread.startswith(names.PEER_THREAD_PREFIX):
        route["reply"] = False  # employees answer each other through their tools (SPEC §8)
    return Placement(lane, thread, route)


@dataclass
class RouteStats:
    """What one routing pass did."""

    routed: int = 0
    no_consumer: int = 0
    dead: int = 0
    dead_reasons: list[str | None] = field(default_factory=list)  # of the rows settled dead
    digested: int = 0  # ipc wakes the storm guard collected into a digest (also `routed`)
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


USER_THREAD = re.compile(r"^u_[0-9a-f]{16}$")


def thread_of(sub: dict[str, Any], envelope: object, ingress_id: int) -> str:
    """The event's thread: a user's chat is always its own thread (EG3, EG17), the one its
    user record names (`data.thread`, written by the owner API); everything else, the admin's
    chat included, as the trigger's `thread_by` says."""
    audience = chat_audience(sub, envelope)
    if audience is not None and audience != users.OWNER:
        thread = lookup(envelope, "data.thread") if isinstance(envelope, dict) else None
        if isinstance(thread, str) and USER_THREAD.match(thread):
            return thread
        # A message accepted before user records had ids: the thread its name gave then.
        return users.legacy_thread_of(audience)
    return thread_for(sub["thread_by"], envelope, ingress_id)


def class_of(sub: dict[str, Any], envelope: object) -> int | None:
    """A user's chat runs at C2 unless the admin granted its user C1 (SPEC §17: the owner's
    guest); None: the subscription's class."""
    audience = chat_audience(sub, envelope)
    if audience is None or audience == users.OWNER:
        return None
    granted = lookup(envelope, "data.class") if isinstance(envelope, dict) else None
    return names.C1_OWNER if granted == names.C1_OWNER else names.C2_CUSTOMER


def entity_id(employee: str, generation: int, lane: str, thread: str) -> str:
    """The ConversationWorkflow id of a stream (SPEC §7)."""
    return names.entity_id(employee, generation, lane, thread)


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
    if sub["trigger_kind"] in names.CHANNEL_KINDS:
        if grouped:
            route["group"] = True  # a customer group: its own debounce (SPEC §8)
        # The reply goes back through the account the event came in on, to the chat it came
        # from (the driver's `data.reply_to`); the outbox seals the recipient at rest.
        route["account"] = sub["source_key"]
        reply_to = lookup(envelope, "data.reply_to") if isinstance(envelope, dict) else None
        if isinstance(reply_to, str) and reply_to:
            route["recipient"] = reply_to
        else:
            route["reply"] = False  # nowhere to answer
    return route


def placement(sub: dict[str, Any], envelope: object, ingress_id: int) -> Placement:
    """The stream and route of one delivery."""
    if sub["thread_by"] == names.THREAD_BY_EXPLICIT:
        return placed(sub, envelope)
    thread = thread_of(sub, envelope, ingress_id)
    return Placement(sub["lane"], thread, _route_of(sub, envelope, thread),
                     class_of(sub, envelope))  # fmt: skip


async def _deliver(conn: Conn, row: dict[str, Any], sub: dict[str, Any], place: Placement,
                   stats: RouteStats) -> tuple[str, int]:  # fmt: skip
    lane, thread = place.lane, place.thread
    key = names.stream_key(sub["employee"], sub["generation"], lane, thread)
    cur = await conn.execute(
        Q["stream_allocate_seq"],
        {
            "stream_key": key,
            "employee": sub["employee"],
            "generation": sub["generation"],
            "lane": lane,
            "thread": thread,
            "hold_reason": _hold(sub),
            "entity_id": entity_id(sub["employee"], sub["generation"], lane, thread),
            "class": place.klass or sub["class"],
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
            "route": Jsonb(place.route),
            "class": place.klass or sub["class"],
            "thread": thread,
            "type": row["type"],
            "payload": Jsonb(row["envelope"]) if row["envelope"] is not None else None,
            "body_ref": row["body_ref"],
            "size": row["size"],
            "chain_id": row["chain_id"],
            "hop": row["hop"],
            "causation_id": row["causation_id"],
        },
    )
    if sub["trigger_kind"] in names.INBOUND_KINDS:  # a message arrived: its follow-ups end
        await cancel_follow_ups(conn, sub["employee"], sub["generation"], lane, thread)
    stats.deliveries += 1
    stats.streams.add(key)
    return key, seq


async def _serve(conn: Conn, row: dict[str, Any], sub: dict[str, Any], place: Placement,
                 stats: RouteStats, now: datetime) -> watch.Routed:  # fmt: skip
    """One matched subscription: a delivery, or for watched data what `watch` decides."""
    change = watch.change_of(row) if sub["trigger_kind"] == "watch" else None
    if change is None:
        await _deliver(conn, row, sub, place, stats)
        return watch.Routed(True)

    async def deliver(form: dict[str, Any]) -> tuple[str, int]:
        return await _deliver(conn, form, sub, place, stats)

    return await watch.route_change(conn, row, sub, change, deliver, now)


async def _storm_gate(conn: Conn, row: dict[str, Any], now: datetime,
                      stats: RouteStats) -> tuple[str, str] | None:  # fmt: skip
    """Storm guards for a wake between employees (I8): how the row settles when it is not
    delivered one by one (suppressed as a loop, or taken into the edge's digest)."""
    if not str(row["source_key"]).startswith(names.SOURCE_IPC + ":"):
        return None
    verdict = await storm.gate(conn, row, now)
    if verdict.action == storm.SUPPRESS:
        await ipc.cancel_cut_task(conn, row, str(verdict.reason), now)
        return names.INGRESS_DEAD, str(verdict.reason)
    if verdict.action == storm.DIGEST:
        stats.digested += 1
        return names.INGRESS_ROUTED, names.STORM_DIGESTED
    return None


def replay_targets(row: dict[str, Any], subs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The subscriptions a row may reach: a replayed delivery only its own trigger, in its
    employee's live generation (never every subscriber of its source anew); any other row, all."""
    employee, trigger = row.get("replay_employee"), row.get("replay_trigger")
    if employee is None:
        return subs
    return [s for s in subs if s["employee"] == employee and s["trigger_name"] == trigger]


def _match(row: dict[str, Any], subs: list[dict[str, Any]]
           ) -> tuple[list[tuple[dict[str, Any], Placement]], str, str | None]:  # fmt: skip
    """The subscriptions a row reaches (at most FANOUT_MAX) with their placements, the status
    it takes when none does, and its note (a filter or placement error, the fan-out cap)."""
    status, error = names.INGRESS_NO_CONSUMER, None
    matched: list[tuple[dict[str, Any], Placement]] = []
    try:
        for sub in replay_targets(row, subs):
            if type_matches(list(sub["event_types"]), str(row["type"])) and filter_matches(
                sub["filter"], row["envelope"]
            ):
                matched.append((sub, placement(sub, row["envelope"], int(row["id"]))))
    except FilterError as exc:
        status, error, matched = names.INGRESS_DEAD, f"filter_error: {exc}", []
    except PlacementError as exc:
        status, error, matched = names.INGRESS_DEAD, f"placement_invalid: {exc}", []
    if len(matched) > names.FANOUT_MAX:
        error = f"fanout_capped: {len(matched)} subscriptions, first {names.FANOUT_MAX} served"
        matched = matched[: names.FANOUT_MAX]
    return matched, status, error


async def _route_row(conn: Conn, row: dict[str, Any], subs: list[dict[str, Any]],
                     stats: RouteStats, now: datetime) -> None:  # fmt: skip
    """A row that needs the storm guards or watch coalescing, one statement at a time."""
    held = await _storm_gate(conn, row, now, stats)
    if held is not None:
        await _settle(conn, row, held[0], held[1], stats)
        return
    matched, status, error = _match(row, subs)
    notes = [error] if error else []
    for sub, place in matched:
        served = await _serve(conn, row, sub, place, stats, now)
        notes += [served.note] if served.note else []
        if served.reached:
            status = names.INGRESS_ROUTED
    await _settle(conn, row, status, "; ".join(notes) or None, stats)


def _count(stats: RouteStats, status: str, error: str | None) -> None:
    if status == names.INGRESS_ROUTED:
        stats.routed += 1
    elif status == names.INGRESS_DEAD:
        stats.dead += 1
        stats.dead_reasons.append(error)
    else:
        stats.no_consumer += 1


async def _settle(conn: Conn, row: dict[str, Any], status: str, error: str | None,
                  stats: RouteStats) -> None:  # fmt: skip
    params = {"id": row["id"], "received_at": row["received_at"], "status": status, "error": error}
    await conn.execute(Q["ingress_mark"], params)
    _count(stats, status, error)


@dataclass
class Batch:
    """Rows routed together, written by one statement (`routing_write_batch`, its inputs as
    JSON documents): each stream takes its seqs at once, in the order its deliveries were
    added (ingress id order within a source), the payloads are copied inside the database,
    the rows are marked."""

    streams: dict[str, dict[str, Any]] = field(default_factory=dict)
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    marks: list[dict[str, Any]] = field(default_factory=list)
    follow_ups: dict[str, dict[str, Any]] = field(default_factory=dict)

    def deliver(self, row: dict[str, Any], sub: dict[str, Any], place: Placement) -> None:
        """Add one delivery."""
        employee, generation = sub["employee"], sub["generation"]
        lane, thread = place.lane, place.thread
        klass = place.klass or sub["class"]
        key = names.stream_key(employee, generation, lane, thread)
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = {
                "stream_key": key, "employee": employee, "generation": generation, "lane": lane,
                "thread": thread, "hold_reason": _hold(sub), "class": klass, "n": 0,
                "entity_id": entity_id(employee, generation, lane, thread),
            }  # fmt: skip
        stream["class"] = min(stream["class"], klass)
        self.deliveries.append({
            "stream_key": key, "k": stream["n"], "ingress_id": row["id"],
            "subscription_id": sub["id"], "route": place.route, "class": klass,
        })  # fmt: skip
        stream["n"] += 1
        if sub["trigger_kind"] in names.INBOUND_KINDS:  # a message arrived: its follow-ups end
            self.follow_ups[key] = {"employee": employee, "generation": generation, "lane": lane,
                                    "thread": thread}  # fmt: skip

    def mark(self, row: dict[str, Any], status: str, error: str | None) -> None:
        self.marks.append({"id": row["id"], "received_at": row["received_at"].isoformat(),
                           "status": status, "error": error})  # fmt: skip

    def params(self) -> dict[str, str]:
        docs = {"streams": list(self.streams.values()), "deliveries": self.deliveries,
                "marks": self.marks, "follow_ups": list(self.follow_ups.values())}  # fmt: skip
        return {name: json.dumps(doc, separators=(",", ":")) for name, doc in docs.items()}

    async def flush(self, conn: Conn, stats: RouteStats) -> None:
        """Write what was added, then start empty."""
        if not self.marks:
            return
        await conn.execute(Q["routing_write_batch"], self.params())
        stats.deliveries += len(self.deliveries)
        stats.streams.update(self.streams)
        self.streams, self.deliveries, self.marks, self.follow_ups = {}, [], [], {}


def _hold(sub: dict[str, Any]) -> str | None:
    """The hold a new stream of the subscription's generation starts with."""
    if sub["generation_state"] == names.GEN_STARTING:
        return names.HOLD_STARTING
    return names.HOLD_PAUSED if sub["generation_state"] == names.GEN_PAUSED else None


def _plan(batch: Batch, row: dict[str, Any], subs: list[dict[str, Any]],
          stats: RouteStats) -> None:  # fmt: skip
    matched, status, error = _match(row, subs)
    for sub, place in matched:
        batch.deliver(row, sub, place)
    status = names.INGRESS_ROUTED if matched else status
    batch.mark(row, status, error)
    _count(stats, status, error)


def _guarded(source: str) -> bool:
    """Wakes between employees: the storm guards decide on each row (I8)."""
    return source.startswith(names.SOURCE_IPC + ":")


def _some_one_by_one(source: str, subs: list[dict[str, Any]]) -> bool:
    """Whether rows of a source may be routed one by one (storm guards, watched data)."""
    return _guarded(source) or any(s["trigger_kind"] == "watch" for s in subs)


def _one_by_one(row: dict[str, Any], subs: list[dict[str, Any]]) -> bool:
    """A row the storm guards or watch coalescing decide on."""
    if _guarded(str(row["source_key"])):
        return True
    kind = str(row["type"])
    return any(s["trigger_kind"] == "watch" and type_matches(list(s["event_types"]), kind)
               for s in subs)  # fmt: skip


def _needs_envelope(source: str, subs: list[dict[str, Any]]) -> bool:
    """Whether routing a source's rows reads their envelopes (filters, placement, threads,
    chat and channel routes, storm guards, watched data); else the router never loads them."""
    return _some_one_by_one(source, subs) or any(
        sub["filter"] or sub["thread_by"] not in (None, "event")
        or sub["trigger_kind"] in ("chat", *names.CHANNEL_KINDS)
        for sub in subs
    )  # fmt: skip


async def _subscriptions(conn: Conn, sources: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The live subscriptions of each source (their generations locked shared)."""
    cur = await conn.execute(Q["subscriptions_for_sources"], {"sources": sources})
    subs: dict[str, list[dict[str, Any]]] = {s: [] for s in sources}
    for sub in await cur.fetchall():
        subs[str(sub["source_key"])].append(sub)
    return subs


async def route_sources(conn: Conn, sources: list[str], stats: RouteStats,
                        rows: int = ROWS_PER_PASS, now: datetime | None = None) -> int:  # fmt: skip
    """Route the next accepted rows (`rows` shared among them) of the sources this transaction
    can lock (another router holds the others); the rows routed. `now` is the storm guards'
    clock (tests pass theirs)."""
    now = now or datetime.now(UTC)
    async with conn.transaction():
        cur = await conn.execute(Q["ingress_sources_lock"], {"sources": sources})
        locked = [str(r["source_key"]) for r in await cur.fetchall() if r["locked"]]
        stats.busy_sources += len(sources) - len(locked)
        if not locked:
            return 0
        subs = await _subscriptions(conn, locked)
        share = max(1, rows // len(locked))
        params = {
            "sources": locked,
            "envelopes": [_needs_envelope(s, subs[s]) for s in locked],
            "limits": [min(share, ONE_BY_ONE_PER_PASS) if _some_one_by_one(s, subs[s]) else share
                       for s in locked],
        }  # fmt: skip
        cur = await conn.execute(Q["ingress_next_for_sources"], params)
        found = await cur.fetchall()
        batch = Batch()
        for row in found:
            mine = subs[str(row["source_key"])]
            if _one_by_one(row, mine):
                await batch.flush(conn, stats)  # earlier rows take their seqs first
                await _route_row(conn, row, mine, stats, now)
            else:
                _plan(batch, row, mine, stats)
        await batch.flush(conn, stats)
        await _expire_ticks(conn, found, subs)
    return len(found)


async def _expire_ticks(conn: Conn, found: list[dict[str, Any]],
                        subs: dict[str, list[dict[str, Any]]]) -> None:  # fmt: skip
    """One pending tick per schedule (SPEC §15): the ticks just routed supersede the older
    ones still waiting (a hold, a busy stream), in the routing transaction."""
    cron = {str(r["source_key"]) for r in found
            if str(r["source_key"]).startswith(names.SOURCE_CRON + ":")}  # fmt: skip
    ids = [int(sub["id"]) for source in cron for sub in subs[source]]
    if ids:
        await conn.execute(Q["cron_ticks_expire"], {"subscriptions": ids, "stream_keys": []})


async def route_pass(conn: Conn, *, sources: int = SOURCES_PER_PASS, now: datetime | None = None,
                     owner: bool | None = None) -> RouteStats:  # fmt: skip
    """One pass over the sources with accepted rows, in one transaction (`now`: the storm
    guards' clock); with `owner`, over those holding owner (C1) rows only, or (False) over
    the others only: the router's owner lane never waits for a pass over background sources."""
    stats = RouteStats()
    params = {"limit": sources, "owner": owner}
    cur = await conn.execute(Q["ingress_sources_pending"], params)
    pending = [str(r["source_key"]) for r in await cur.fetchall()]
    await conn.commit()
    if pending:
        await route_sources(conn, pending, stats, now=now)
    return stats
