"""`GET /v1/employees/{name}/waiting`: every input of an employee not consumed yet, with the
gate that holds it (eventos.timeline.gates), read from the database alone (I2): accepted rows
the router has not routed, routed inputs the relay has not sent or the entity has not
consumed, and messages collected into an edge's digest. A bounded list: the oldest first, and
how many more there are."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from eventos import names
from eventos.contracts import DeliveryItem
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import NotFound
from eventos.scheduling.policy import Load, SchedConfig, Waiter
from eventos.timeline.gates import (
    BREAKER_OPEN,
    EDGE_RATE,
    ROUTING,
    Facts,
    Gate,
    StreamFacts,
    delivered_gate,
    pending_gate,
)
from eventos.timeline.words import source_words

BREAKER_FRESH_S = 30.0  # a relay refreshes an open breaker at every probe (5 s)
WAITERS_READ = 2000
INPUT_READ = 200  # one input's gate: its stream's open inputs read up to here
OPEN = ("pending", "held", "delivered")
UNROUTED_TEXT = "accepted; the router has not routed it to a conversation yet"


@dataclass
class Waiting:
    """The answer: entries oldest first, and how many inputs were left out."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    more: int = 0
    as_of: datetime | None = None


def gate_view(g: Gate) -> dict[str, Any]:
    view = {"code": g.code, "text": g.text, "until": g.until.isoformat() if g.until else None}
    if g.approval is not None:
        view["approval"] = g.approval
    return view


async def _rows(conn: Conn, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    cur = await conn.execute(Q[name], params)
    return await cur.fetchall()


async def _facts(conn: Conn, employee: str, sched: SchedConfig) -> Facts | None:
    """The employee's gates alike for every input; None without a live generation."""
    rows = await _rows(conn, "waiting_employee", {"employee": employee,
                                                  "fresh_s": BREAKER_FRESH_S})  # fmt: skip
    if not rows:
        raise NotFound(f"no employee {employee!r}")
    r = rows[0]
    if r["generation"] is None:
        return None
    return Facts(
        now=r["now"], generation=int(r["generation"]), generation_state=str(r["state"]),
        pause_reason=r["pause_reason"], budget_state=r["budget_state"] or names.BUDGET_NORMAL,
        daily_usd=r["daily_usd"], used_usd=Decimal(r["used_usd"] or 0),
        period_end=r["period_end"], breaker_probe_at=r["breaker_probe_at"],
        breaker_opened_at=r["breaker_opened_at"], sched=sched,
    )  # fmt: skip


async def _scheduler(conn: Conn, f: Facts) -> None:
    """The admission queue and what holds slots (as admission reads them)."""
    waiters = await _rows(conn, "waiters_list", {"limit": WAITERS_READ})
    f.waiters = [Waiter(r["stream_key"], r["employee"], int(r["class"]), r["requested_at"],
                        r["served_at"], r["offered_at"] is not None, r["takes_held"])
                 for r in waiters]  # fmt: skip
    by_class: dict[int, int] = defaultdict(int)
    by_employee: dict[str, int] = defaultdict(int)
    for r in await _rows(conn, "sched_load", {}):
        by_class[int(r["class"])] += int(r["n"])
        by_employee[r["employee"]] += int(r["n"])
    window = {"window_s": f.sched.share_window_s}
    admitted = {int(r["class"]): int(r["n"]) for r in await _rows(conn, "sched_admitted", window)}
    f.load = Load(dict(by_class), dict(by_employee), admitted)
    for r in await _rows(conn, "waiting_slots_held", {}):
        f.running.setdefault(int(r["class"]), []).append(str(r["turn_id"]))


def _item(r: dict[str, Any]) -> DeliveryItem:
    return DeliveryItem(seq=int(r["seq"]), ingress_id=int(r["ingress_id"]), klass=int(r["class"]),
                        type=str(r["type"]), route=r["route"], chain_id=str(r["chain_id"]),
                        hop=int(r["hop"]), size=int(r["size"]))  # fmt: skip


async def _streams(conn: Conn, employee: str, f: Facts, rows: list[dict[str, Any]]
                   ) -> dict[str, StreamFacts]:  # fmt: skip
    """Each listed input's stream: its open inputs in the entity's hands and its turns."""
    streams: dict[str, StreamFacts] = {}
    for r in rows:
        s = streams.setdefault(r["stream_key"], StreamFacts(
            r["stream"], int(r["window_inputs"]), int(r["window_bytes"]), [], {}))  # fmt: skip
        s.born[int(r["seq"])] = r["created_at"]
        if r["status"] == "delivered":
            s.delivered.append(_item(r))
    pairs = sorted({(r["stream_key"], str(r["route"].get("agent") or "")) for r in rows})
    params = {"employee": employee, "generation": f.generation,
              "streams": [p[0] for p in pairs], "agents": [p[1] for p in pairs],
              "threads": [streams[p[0]].row["thread"] for p in pairs],
              "approval_held": names.APPROVAL_HELD}  # fmt: skip
    for t in await _rows(conn, "waiting_turns", params):
        s = streams[t["stream_key"]]
        if t["approval_id"] is not None:  # saved (its reply held) or not: it holds the stream
            s.held = t
        if t["status"] == "running":
            s.running = t
        elif s.last_ended_at is None or t["ended_at"] > s.last_ended_at:
            s.last_ended_at = t["ended_at"]
    return streams


def _entry(r: dict[str, Any], gate: Gate) -> dict[str, Any]:
    route = r["route"]
    what = {"source": route.get("kind"), "trigger": route.get("trigger"), "type": r["type"],
            "from": route.get("from")}  # fmt: skip
    return {
        "stream": r["stream_key"], "thread": r["thread"], "lane": r["lane"], "seq": r["seq"],
        "class": r["class"], "since": r["created_at"].isoformat(), "status": r["status"],
        "ref": str(r["id"]), "input": source_words(what), "gate": gate_view(gate),
    }  # fmt: skip


async def _unrouted(conn: Conn, employee: str, f: Facts, limit: int
                    ) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    params = {"employee": employee, "generation": f.generation, "limit": limit}
    rows = await _rows(conn, "waiting_unrouted", params)
    gate = gate_view(Gate(ROUTING, UNROUTED_TEXT))
    entries = [{
        "stream": None, "thread": None, "lane": None, "seq": None, "class": None,
        "since": r["received_at"].isoformat(), "status": "accepted", "ref": str(r["id"]),
        "input": r["source_key"], "gate": gate,
    } for r in rows]  # fmt: skip
    return entries, int(rows[0]["total"]) - len(rows) if rows else 0


async def _digests(conn: Conn, employee: str, limit: int) -> list[dict[str, Any]]:
    entries = []
    for r in await _rows(conn, "waiting_digests", {"employee": employee, "limit": limit}):
        sender, due, n = r["sender"], r["due_at"], int(r["count"])
        if r["breaker"] == names.BREAKER_CLOSED:
            gate = Gate(EDGE_RATE, f"{n} messages from {sender} came faster than the edge's rate "
                        "(10 a minute): collected into one digest, delivered at "
                        f"{due.isoformat(timespec='seconds')}", due)  # fmt: skip
        else:
            gate = Gate(BREAKER_OPEN, f"the breaker of messages from {sender} is {r['breaker']}: "
                        f"{n} messages collected into one digest, delivered at "
                        f"{due.isoformat(timespec='seconds')}", due)  # fmt: skip
        entries.append({
            "stream": None, "thread": r["thread"],
            "lane": names.LANE_WORKER, "seq": None, "class": names.C3_INTERNAL,
            "since": (r["opened_at"] or due).isoformat(), "status": "digest", "ref": sender,
            "input": f"{n} messages from {sender}", "gate": gate_view(gate),
        })  # fmt: skip
    return entries


async def waiting(conn: Conn, employee: str, limit: int, sched: SchedConfig,
                  stream: str | None = None) -> Waiting:  # fmt: skip
    """Every input of the employee not consumed yet (at most `limit` of each kind listed);
    with `stream`, only that stream's routed inputs."""
    f = await _facts(conn, employee, sched)
    if f is None:
        return Waiting()
    params = {"employee": employee, "generation": f.generation, "limit": limit, "stream": stream}
    rows = await _rows(conn, "waiting_inputs", params)
    if stream is None:
        total = int((await _rows(conn, "waiting_count", params))[0]["n"])
    else:  # one stream's, read for one input's gate: nothing counts what was left out
        total = len(rows)
    if any(r["status"] == "delivered" for r in rows):
        await _scheduler(conn, f)
    streams = await _streams(conn, employee, f, rows) if rows else {}
    out = Waiting(as_of=f.now)
    for r in rows:
        s, klass = streams[r["stream_key"]], int(r["class"])
        gate = delivered_gate(f, s, klass, r["chain_id"]) if r["status"] == "delivered" else (
            pending_gate(f, s, klass))  # fmt: skip
        out.entries.append(_entry(r, gate))
    if stream is not None:
        return out
    unrouted, more_unrouted = await _unrouted(conn, employee, f, limit)
    entries = unrouted + out.entries + await _digests(conn, employee, limit)
    out.entries = entries[:limit]
    out.more = max(0, total - len(rows)) + more_unrouted + len(entries) - len(out.entries)
    return out


async def input_gate(conn: Conn, employee: str, ingress_id: int, sched: SchedConfig
                     ) -> dict[str, Any] | None:  # fmt: skip
    """The gate `waiting` gives one input, by its ingress row (an owner message's); None once
    nothing holds it (consumed, settled) or when it lies past what one answer reads."""
    rows = await _rows(conn, "waiting_input_of", {"ingress_id": ingress_id})
    if not rows:
        return None
    r = rows[0]
    if r["delivery_id"] is None:
        if r["ingress_status"] != "accepted":
            return None
        return gate_view(Gate(ROUTING, UNROUTED_TEXT))
    if r["status"] not in OPEN:
        return None
    found = await waiting(conn, employee, INPUT_READ, sched, stream=str(r["stream_key"]))
    ref = str(r["delivery_id"])
    return next((e["gate"] for e in found.entries if e["ref"] == ref), None)
