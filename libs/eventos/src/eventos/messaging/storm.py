"""Storm guards (SPEC §10, I8): internal wakes between employees are checked for hops, cycles
and rate before the router delivers them.

`check` is the one entry point (the router calls it for `ipc:` sources; watched data calls it
for wakes between employees): a wake past 8 hops, one whose target is already on its path, or
one from the target itself is suppressed (the router marks the ingress row `dead` with the
reason, I3). Otherwise the edge (sender → target) takes a token from its bucket (10/min,
burst 20): one bucket per pair of employees, however many threads of the target the sender's
conversations write to (splitting threads per origin conversation does not multiply the
allowance). A wake that finds none is collected into a digest instead of delivered, one digest
per (edge, thread), so a digest quotes one origin conversation only, into its thread (EG17);
3 exhausted one-minute windows in a row open the breaker: every wake is collected and the
edge delivers one digest per 15 minutes, and an attention item names both employees. After an
hour it half-opens: one wake goes through as a probe; the next one within a minute reopens
it, a calm minute closes it. Every time comes from the caller's `now` (tests own the clock).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from eventos import names
from eventos.bus.envelope import encoded_size
from eventos.bus.inbox import IngressRecord, append
from eventos.db import Conn
from eventos.db.sql import Q

DELIVER = "deliver"
SUPPRESS = "suppress"
DIGEST = "digest"
WINDOW = timedelta(seconds=names.STORM_WINDOW_S)
DIGEST_EVERY = timedelta(seconds=names.STORM_DIGEST_EVERY_S)
HALF_OPEN_AFTER = timedelta(seconds=names.STORM_HALF_OPEN_AFTER_S)
DIGESTS_PER_PASS = 100


@dataclass(frozen=True)
class Verdict:
    """What to do with one wake: deliver it, suppress it (`reason` says why), or collect it
    into the edge's digest. `opened` is set when this wake opened the breaker."""

    action: str
    reason: str | None = None
    opened: bool = False


@dataclass(frozen=True)
class Edge:
    """An edge's bucket and breaker, as `decide` reads and writes them."""

    tokens: float
    updated_at: datetime
    exhausted_windows: int = 0
    last_exhausted_window: datetime | None = None
    breaker: str = names.BREAKER_CLOSED
    opened_at: datetime | None = None
    probe_at: datetime | None = None


def loop_reason(sender: str, target: str, hop: int, path: list[str]) -> str | None:
    """Why a wake is a loop (hops, a cycle, a self-wake), or None."""
    if sender == target:
        return f"{names.LOOP_SUPPRESSED}: self-wake {sender}"
    if hop > names.STORM_HOPS_MAX:
        return f"{names.LOOP_SUPPRESSED}: hop {hop}"
    if target in path:
        return f"{names.LOOP_SUPPRESSED}: cycle {' -> '.join([*path, target])}"
    return None


def window_of(now: datetime) -> datetime:
    """The start of the one-minute window `now` falls in."""
    return now - timedelta(seconds=now.timestamp() % names.STORM_WINDOW_S)


def refilled(edge: Edge, now: datetime) -> Edge:
    elapsed = max((now - edge.updated_at).total_seconds(), 0.0)
    tokens = min(names.STORM_BURST, edge.tokens + elapsed * names.STORM_RATE_PER_MIN / 60)
    return replace(edge, tokens=tokens, updated_at=max(now, edge.updated_at))


def _exhausted(edge: Edge, now: datetime) -> tuple[Edge, Verdict]:
    """No token: the wake goes to the digest; the window counts once; 3 in a row open."""
    window = window_of(now)
    if edge.last_exhausted_window == window:
        return edge, Verdict(DIGEST)
    in_a_row = edge.last_exhausted_window == window - WINDOW
    count = edge.exhausted_windows + 1 if in_a_row else 1
    edge = replace(edge, exhausted_windows=count, last_exhausted_window=window)
    if count >= names.STORM_WINDOWS_TO_OPEN:
        return _opened(edge, now), Verdict(DIGEST, opened=True)
    return edge, Verdict(DIGEST)


def _opened(edge: Edge, now: datetime) -> Edge:
    return replace(edge, breaker=names.BREAKER_OPEN, opened_at=now, probe_at=None)


def _closed(edge: Edge) -> Edge:
    return replace(edge, breaker=names.BREAKER_CLOSED, exhausted_windows=0,
                   last_exhausted_window=None, opened_at=None, probe_at=None)  # fmt: skip


def decide(edge: Edge, now: datetime) -> tuple[Edge, Verdict]:
    """One wake on an edge: the bucket and the breaker (pure; `now` is the caller's)."""
    edge = refilled(edge, now)
    if edge.breaker == names.BREAKER_OPEN and edge.opened_at is not None:
        if now - edge.opened_at < HALF_OPEN_AFTER:
            return edge, Verdict(DIGEST)
        edge = replace(edge, breaker=names.BREAKER_HALF_OPEN, probe_at=None)
    if edge.breaker == names.BREAKER_HALF_OPEN:
        if edge.probe_at is None:  # the probe goes through
            return replace(edge, probe_at=now, tokens=max(edge.tokens - 1, 0.0)), Verdict(DELIVER)
        if now - edge.probe_at < WINDOW:  # not calm: open again for another hour
            return _opened(edge, now), Verdict(DIGEST, opened=True)
        edge = _closed(edge)
    if edge.tokens >= 1:
        return replace(edge, tokens=edge.tokens - 1), Verdict(DELIVER)
    return _exhausted(edge, now)


def _edge_of(row: dict[str, Any]) -> Edge:
    return Edge(float(row["tokens"]), row["updated_at"], int(row["exhausted_windows"]),
                row["last_exhausted_window"], str(row["breaker"]), row["opened_at"],
                row["probe_at"])  # fmt: skip


def edge_ref(sender: str, target: str) -> str:
    """The attention ref of an edge."""
    return f"edge:{sender}->{target}"


async def check(conn: Conn, sender: str, target: str, chain_id: str, hop: int,
                path: list[str], now: datetime, *, rated: bool = True) -> Verdict:  # fmt: skip
    """The guards for one wake from `sender` to `target`, inside the caller's transaction
    (the edge row stays locked until it commits). `rated=False` checks loops only (a task
    result: one per task by compare-and-swap, bounded by the open-task cap)."""
    reason = loop_reason(sender, target, hop, path)
    edge = {"sender": sender, "target": target, "burst": names.STORM_BURST, "now": now}
    if reason is not None:
        await conn.execute(Q["storm_edge_suppressed"], edge)
        detail = f"a wake from {sender} to {target} was cut ({reason}, chain {chain_id})"
        await _attention(conn, sender, target, names.ATTENTION_LOOP_SUPPRESSED, detail)
        return Verdict(SUPPRESS, reason)
    if not rated:
        return Verdict(DELIVER)
    await conn.execute(Q["storm_edge_ensure"], edge)
    cur = await conn.execute(Q["storm_edge_get"], edge)
    state, verdict = decide(_edge_of(dict(await cur.fetchone() or {})), now)
    await conn.execute(Q["storm_edge_save"], {
        "sender": sender, "target": target, "tokens": state.tokens,
        "updated_at": state.updated_at, "exhausted_windows": state.exhausted_windows,
        "last_exhausted_window": state.last_exhausted_window, "breaker": state.breaker,
        "opened_at": state.opened_at, "probe_at": state.probe_at,
        "passed": int(verdict.action == DELIVER), "digested": int(verdict.action == DIGEST),
    })  # fmt: skip
    if verdict.opened:
        await _attention(conn, sender, target, names.ATTENTION_BREAKER_OPEN, (
            f"messages from {sender} to {target} exceeded {names.STORM_RATE_PER_MIN:g}/min for "
            f"{names.STORM_WINDOWS_TO_OPEN} minutes: the breaker is open; {target} gets one "
            "digest every 15 minutes, and the edge half-opens after an hour"))  # fmt: skip
    return verdict


async def _attention(conn: Conn, sender: str, target: str, kind: str, detail: str) -> None:
    await conn.execute(Q["storm_attention_raise"], {
        "employee": target, "kind": kind, "ref": edge_ref(sender, target), "detail": detail,
    })  # fmt: skip


async def collect(conn: Conn, sender: str, target: str, thread: str, text: str, chain_id: str,
                  hop: int, path: list[str], now: datetime, *,
                  breaker_open: bool) -> None:  # fmt: skip
    """Put one wake into the digest of its edge and the target's `thread` it was placed in
    (after `check` said DIGEST, same transaction)."""
    due = now + (DIGEST_EVERY if breaker_open else WINDOW)
    await conn.execute(Q["storm_digest_add"], {
        "sender": sender, "target": target, "thread": thread,
        "text": text[: names.STORM_DIGEST_TEXT_CHARS],
        "texts_max": names.STORM_DIGEST_TEXTS_MAX, "hop": hop, "path": Jsonb(path),
        "chain_id": chain_id, "due_at": due,
    })  # fmt: skip


def digest_record(row: dict[str, Any]) -> IngressRecord:
    """One digest of an edge, for the target's inbox in the thread its wakes were placed in."""
    sender, target, count = str(row["sender"]), str(row["target"]), int(row["count"])
    thread, texts = str(row["thread"]), list(row["texts"] or [])
    lines = [f"[digest: {count} message(s) from {sender} held by the storm guard "
             f"(breaker {row['breaker']}); {len(texts)} quoted]"]  # fmt: skip
    lines += [f"- {t}" for t in texts]
    number = int(row["sent"]) + 1
    data = {"text": "\n".join(lines), "from": sender, "count": count, "texts": texts}
    envelope = {
        "specversion": "1.0", "id": f"digest-{sender}-{target}-{thread}-{number}",
        "source": f"/employees/{sender}", "type": names.TYPE_IPC_DIGEST,
        "datacontenttype": "application/json", "data": data,
        names.ATTR_LANE: names.LANE_WORKER, names.ATTR_THREAD: thread,
        names.ATTR_ROUTE: {"kind": names.IPC_ROUTE_KIND, "reply": False, "from": sender},
        names.ATTR_PATH: list(row["path"] or [])[: names.STORM_PATH_MAX],
    }  # fmt: skip
    return IngressRecord(
        source_key=names.source_key(names.SOURCE_IPC, target),
        dedupe_key=f"digest:{sender}:{target}:{thread}:{number}", type=names.TYPE_IPC_DIGEST,
        chain_id=str(row["chain"] or envelope["id"]), envelope=envelope,
        size=encoded_size(envelope), klass=names.C3_INTERNAL, hop=int(row["hop"]),
    )  # fmt: skip


async def flush_due(conn: Conn, now: datetime) -> int:
    """Deliver every digest that is due (the router's upkeep); how many went out."""
    async with conn.transaction():
        cur = await conn.execute(Q["storm_digests_due"], {"now": now, "limit": DIGESTS_PER_PASS})
        rows = [dict(r) for r in await cur.fetchall()]
        await append(conn, [digest_record(r) for r in rows])
        for r in rows:
            await conn.execute(Q["storm_digest_sent"], r)
    return len(rows)


def wake_of(row: dict[str, Any]) -> tuple[str | None, str, list[str], str]:
    """(sender, target, path, text) of an ingress row on an `ipc:` source (its thread:
    `thread_of`)."""
    env: dict[str, Any] = row["envelope"] if isinstance(row["envelope"], dict) else {}
    sender = env.get(names.ATTR_SENDER)
    path = path_of(env)
    data: dict[str, Any] = env["data"] if isinstance(env.get("data"), dict) else {}
    text = data.get("text") if isinstance(data.get("text"), str) else json.dumps(data)[:500]
    target = str(row["source_key"]).split(":", 1)[1]
    return (sender if isinstance(sender, str) else None), target, path, str(text)


def thread_of(row: dict[str, Any]) -> str:
    """The target's thread an ingress row on an `ipc:` source is placed in (`eventosthread`;
    a row without one is refused by the router's placement, never delivered)."""
    env: dict[str, Any] = row["envelope"] if isinstance(row["envelope"], dict) else {}
    thread = env.get(names.ATTR_THREAD)
    return thread if isinstance(thread, str) else ""


async def guard(conn: Conn, sender: str, target: str, thread: str, chain_id: str, hop: int,
                path: list[str], text: str, now: datetime, *,
                rated: bool = True) -> Verdict:  # fmt: skip
    """`check`, and on DIGEST the wake's `text` collected into the digest of the edge and the
    target's `thread` (the caller then settles the row without a delivery). For routers of
    internal wakes."""
    verdict = await check(conn, sender, target, chain_id, hop, path, now, rated=rated)
    if verdict.action == DIGEST:
        cur = await conn.execute(Q["storm_edge_get"], {"sender": sender, "target": target})
        state = await cur.fetchone() or {}
        await collect(conn, sender, target, thread, text, chain_id, hop, path, now,
                      breaker_open=state.get("breaker") == names.BREAKER_OPEN)  # fmt: skip
    return verdict


def path_of(envelope: object) -> list[str]:
    """The employees an event's wake went through (`eventospath`)."""
    env = envelope if isinstance(envelope, dict) else {}
    return [p for p in env.get(names.ATTR_PATH) or [] if isinstance(p, str)]


async def gate(conn: Conn, row: dict[str, Any], now: datetime) -> Verdict:
    """The guards for one ingress row of an `ipc:` source (the router's call). Rows without a
    sender are the platform's own (digests, deadlines): they pass."""
    sender, target, path, text = wake_of(row)
    if sender is None or row["type"] == names.TYPE_IPC_DIGEST:
        return Verdict(DELIVER)
    rated = row["type"] != names.TYPE_IPC_RESULT
    chain, hop = str(row["chain_id"]), int(row["hop"])
    return await guard(conn, sender, target, thread_of(row), chain, hop, path, text, now,
                       rated=rated)  # fmt: skip
