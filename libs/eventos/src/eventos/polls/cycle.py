"""One poll cycle, database side (SPEC §7 PollWorkflow, §15 Polls).

A cycle reads the trigger from its generation's frozen spec and its cursor row, skips when the
source has 1,000 unrouted rows, fetches one page outside any transaction, then in ONE
transaction appends the page's new items (at most 50 or 512 KB) and advances the cursor. The
row's `revision` fences that transaction: an attempt whose fetch started from an older row
(a retry raced a slow predecessor) writes nothing. So a worker killed between fetch and append
loses nothing (the cursor did not move) and doubles nothing (the next fetch starts from it,
and items already in the bus are skipped by their dedupe keys).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from psycopg_pool import AsyncConnectionPool

from eventos import failures, names
from eventos.bus.envelope import encoded_size, new_event_id
from eventos.bus.inbox import (
    Accepted,
    IngressRecord,
    Rejected,
    append,
    append_isolated,
    bounded_dedupe_key,
)
from eventos.contracts import PollTrigger
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import EventOSError, PollFailed
from eventos.polls.fetch import Page, fetch, item_id, parse_page
from eventos.settings import SecretStore
from eventos.spec.model import Trigger, parse_spec


class PollEnded(EventOSError):
    """The poll trigger's generation does not run (paused, retired or gone): polling stops."""


@dataclass(frozen=True)
class Verdict:
    """How a cycle ended (`appended`, `skipped`, `held` with its hold in `error`, `failed`,
    `stale`) and when the next comes."""

    outcome: str
    delay_s: float
    appended: int = 0
    failures: int = 0
    error: str | None = None


def backoff_s(base_s: int, failures: int) -> int:
    """The interval after `failures` consecutive failures: doubled each time, up to an hour."""
    doubled = base_s << min(failures, 16)  # 30 s doubled 7 times passes the hour already
    return max(base_s, min(doubled, names.POLL_BACKOFF_MAX_S))


def jitter_bound_s(interval_s: float) -> float:
    """The largest jitter added to an interval: 10% of it, at most 30 s."""
    return min(interval_s * names.POLL_JITTER_SHARE, names.POLL_JITTER_MAX_S)


def item_record(req: PollTrigger, key: str, item: Any) -> IngressRecord:
    """An item as an ingress record of source `poll:<employee>/<trigger>` (C4), its envelope
    CloudEvents-like as a cron tick's; an item too large for an envelope (64 KB) is a dead row
    with its reason (I3), its id kept."""
    event_id = new_event_id()
    envelope: dict[str, Any] = {
        "specversion": "1.0", "id": event_id, "source": f"/employees/{req.employee}/{req.trigger}",
        "type": names.TYPE_POLL_ITEM, "subject": req.trigger, "datacontenttype": "application/json",
        "data": {"trigger": req.trigger, "id": key, "item": item},
    }  # fmt: skip
    size, status, error = encoded_size(envelope), names.INGRESS_ACCEPTED, None
    if size > names.ENVELOPE_MAX_BYTES:
        envelope["data"] = {"trigger": req.trigger, "id": key, "item_bytes": size}
        status, error = names.INGRESS_DEAD, f"poll item over {names.ENVELOPE_MAX_BYTES} bytes"
        size = encoded_size(envelope)
    return IngressRecord(
        source_key=names.source_key(names.SOURCE_POLL, f"{req.employee}/{req.trigger}"),
        dedupe_key=key, type=names.TYPE_POLL_ITEM, chain_id=event_id, envelope=envelope,
        size=size, klass=names.C4_BACKGROUND, status=status, error=error,
    )  # fmt: skip


def unstorable(rec: IngressRecord, reason: str) -> IngressRecord:
    """The dead row of an item PostgreSQL refused (a NUL in its text), its id kept."""
    data = {"trigger": rec.envelope["data"]["trigger"] if rec.envelope else None,
            "id": rec.dedupe_key}  # fmt: skip
    envelope = {**(rec.envelope or {}), "data": data}
    return replace(rec, envelope=envelope, size=encoded_size(envelope),
                   status=names.INGRESS_DEAD, error=reason)  # fmt: skip


def take(req: PollTrigger, keyed: list[tuple[str, Any]],
         known: set[str]) -> tuple[list[IngressRecord], bool]:  # fmt: skip
    """The page's new items in order, at most 50 or 512 KB; and whether every one was taken."""
    records: list[IngressRecord] = []
    seen, size, left = set(known), 0, False
    for key, item in keyed:
        if bounded_dedupe_key(key) in seen:
            continue
        rec = item_record(req, key, item)
        if records and (len(records) == names.POLL_PAGE_MAX_ITEMS
                        or size + rec.size > names.POLL_PAGE_MAX_BYTES):  # fmt: skip
            left = True
            break
        seen.add(bounded_dedupe_key(key))
        records.append(rec)
        size += rec.size
    return records, not left


@dataclass
class Poller:
    """Runs poll cycles against the database and the endpoints (one per activity attempt)."""

    pool: AsyncConnectionPool[Conn]
    http: httpx.AsyncClient
    secrets: SecretStore
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, interval_s: float) -> float:
        """The wait before the next cycle: the interval plus jitter (≤ 10%, ≤ 30 s)."""
        return interval_s + self.rng.uniform(0.0, jitter_bound_s(interval_s))

    async def cycle(self, req: PollTrigger) -> Verdict:
        """Poll once; PollEnded when the generation does not run."""
        p = {"employee": req.employee, "generation": req.generation, "trigger": req.trigger}
        async with self.pool.connection() as conn:
            trigger = await _running_trigger(conn, req)
            base = int(trigger.interval_s or names.POLL_INTERVAL_MIN_S)
            await conn.execute(Q["poll_cursor_create"], {**p, "interval_s": base})
            row = await _one(conn, "poll_cursor_get", p)
            hold = (await _one(conn, "poll_hold", p))["hold"]
            if hold is not None:  # the relay would hold what it appends (SPEC §9): no fetch
                await conn.execute(Q["poll_cursor_skip"], p)
                return Verdict("held", self.delay(int(row["interval_s"])), error=hold)
            source = names.source_key(names.SOURCE_POLL, f"{req.employee}/{req.trigger}")
            cap = {"source_key": source, "cap": names.POLL_UNROUTED_MAX}
            unrouted = int((await _one(conn, "ingress_unrouted_count", cap))["n"])
            if unrouted >= names.POLL_UNROUTED_MAX:
                await conn.execute(Q["poll_cursor_skip"], p)
                return Verdict("skipped", self.delay(int(row["interval_s"])))
        try:  # no connection is held while the endpoint answers
            page = parse_page(await fetch(self.http, trigger, row["cursor"], self.secrets), trigger)
            keyed = [(item_id(it, trigger, i), it) for i, it in enumerate(page.items)]
        except PollFailed as exc:
            verdict = await self._failed(req, p, base, row, failures.reason(exc))
            if exc.retry_after_s is None:
                return verdict
            # A rate limit's Retry-After (at most an hour) is waited for when it is longer.
            wait = min(exc.retry_after_s, float(names.POLL_BACKOFF_MAX_S))
            return replace(verdict, delay_s=max(verdict.delay_s, wait))
        return await self._append(req, p, base, row, page, keyed, source)

    async def _append(self, req: PollTrigger, p: dict[str, Any], base: int, row: dict[str, Any],
                      page: Page, keyed: list[tuple[str, Any]],
                      source: str) -> Verdict:  # fmt: skip
        async with self.pool.connection() as conn, conn.transaction():
            locked = await _one(conn, "poll_cursor_lock", p)
            if locked["revision"] != row["revision"]:
                return Verdict("stale", self.delay(base))
            keys = [bounded_dedupe_key(k) for k, _ in keyed]
            cur = await conn.execute(Q["poll_dedupe_known"], {"source_key": source, "keys": keys})
            records, all_taken = take(req, keyed, {r["dedupe_key"] for r in await cur.fetchall()})
            outcomes = await append_isolated(conn, records)
            dead = [unstorable(r, o.reason) for r, o in zip(records, outcomes, strict=True)
                    if isinstance(o, Rejected)]  # fmt: skip
            await append(conn, dead)
            appended = sum(isinstance(o, Accepted) for o in outcomes) + len(dead)
            advanced = all_taken and page.cursor is not None
            cursor = page.cursor if advanced else row["cursor"]
            advance = {**p, "cursor": cursor, "interval_s": base, "appended": appended}
            await conn.execute(Q["poll_cursor_advance"], advance)
            if int(row["failures"]) >= names.POLL_FAILURES_DRIVER_DOWN:
                down = {"kind": names.ATTENTION_DRIVER_DOWN, "ref": _ref(req)}
                await conn.execute(Q["attention_resolve"], down)
        full = not all_taken or len(records) >= names.POLL_PAGE_MAX_ITEMS
        delay = names.POLL_FULL_PAGE_DELAY_S if full else self.delay(base)
        return Verdict("appended", delay, appended=appended)

    async def _failed(self, req: PollTrigger, p: dict[str, Any], base: int, row: dict[str, Any],
                      error: str) -> Verdict:  # fmt: skip
        failures = int(row["failures"]) + 1
        interval = backoff_s(base, failures)
        fail = {**p, "interval_s": interval, "error": error, "revision": row["revision"]}
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(Q["poll_cursor_fail"], fail)
            if await cur.fetchone() is None:
                return Verdict("stale", self.delay(base))
            if failures >= names.POLL_FAILURES_DRIVER_DOWN:
                await conn.execute(Q["attention_raise"], {
                    "employee": req.employee, "kind": names.ATTENTION_DRIVER_DOWN,
                    "severity": "error", "ref": _ref(req),
                    "detail": f"poll trigger {req.trigger} failed {failures} times in a row; "
                              f"last: {error}",
                })  # fmt: skip
        return Verdict("failed", self.delay(interval), failures=failures, error=error)


def _ref(req: PollTrigger) -> str:
    return names.poll_id(req.employee, req.generation, req.trigger)


async def _one(conn: Conn, query: str, params: dict[str, Any]) -> dict[str, Any]:
    cur = await conn.execute(Q[query], params)
    row = await cur.fetchone()
    if row is None:
        raise PollEnded(f"{query}: no row for {params}")
    return row


async def _running_trigger(conn: Conn, req: PollTrigger) -> Trigger:
    """The poll trigger of a running generation, or PollEnded."""
    gen = await _one(conn, "generation_control",
                     {"employee": req.employee, "generation": req.generation})  # fmt: skip
    if gen["state"] != names.GEN_RUNNING:
        raise PollEnded(f"generation {req.generation} of {req.employee} is {gen['state']}")
    spec = parse_spec(gen["spec"], stored=True)
    for name, t in zip(spec.trigger_names(), spec.spec.triggers, strict=True):
        if name == req.trigger and t.kind == "poll":
            return t
    raise PollEnded(f"generation {req.generation} of {req.employee} has no poll {req.trigger!r}")
