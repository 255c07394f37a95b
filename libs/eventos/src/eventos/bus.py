"""The bus contract (SPEC §5): append, then route. Producers and the router never see SQL.

`append` is durable on return. `GroupCommitter` coalesces concurrent appends into one
transaction; no caller is answered before the transaction holding its row commits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.db import Conn, translate
from eventos.db.sql import Q
from eventos.errors import DatabaseUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngressRecord:
    """One event to append. `envelope` is CloudEvents JSON (≤ 64 KB) unless `body_ref` is set."""

    source_key: str
    dedupe_key: str
    type: str
    chain_id: str
    envelope: dict[str, Any] | None
    size: int
    klass: int | None = None
    body_ref: str | None = None
    hop: int = 0
    causation_id: str | None = None
    path: str | None = None
    status: str = names.INGRESS_ACCEPTED
    error: str | None = None
    dedupe_ttl_s: int = names.DEDUPE_TTL_DAYS * 86400


@dataclass(frozen=True)
class Accepted:
    """The event was appended (or stored as dead with a reason, which also counts as taken)."""

    id: int


@dataclass(frozen=True)
class Duplicate:
    """An event with the same (source, dedupe key) was appended within the window."""

    id: int


@dataclass(frozen=True)
class Rejected:
    """The event was not appended."""

    reason: str


Outcome = Accepted | Duplicate | Rejected


def _params(rec: IngressRecord, now: datetime) -> dict[str, object]:
    return {
        "source_key": rec.source_key,
        "dedupe_key": rec.dedupe_key,
        "type": rec.type,
        "class": rec.klass,
        "received_at": now,
        "expires_at": now + timedelta(seconds=rec.dedupe_ttl_s),
        "envelope": Jsonb(rec.envelope) if rec.envelope is not None else None,
        "body_ref": rec.body_ref,
        "size": rec.size,
        "chain_id": rec.chain_id,
        "hop": rec.hop,
        "causation_id": rec.causation_id,
        "path": rec.path,
        "status": rec.status,
        "error": rec.error,
    }


async def _outcome(conn: Conn, params: dict[str, object], row: dict[str, Any] | None) -> Outcome:
    if row is None:
        # The key's row committed after our statement's snapshot (the per-source lock makes
        # this unreachable today; kept so a duplicate is never mistaken for a loss).
        cur = await conn.execute(Q["dedupe_get"], params)
        found = await cur.fetchone()
        if found is None:
            raise RuntimeError("dedupe row vanished")  # cannot happen: it was just in conflict
        row = {"accepted": False, "id": found["ingress_id"], "received_at": found["received_at"]}
    if row["accepted"]:
        return Accepted(int(row["id"]))
    await conn.execute(Q["ingress_count_duplicate"], row)
    return Duplicate(int(row["id"]))


async def append(conn: Conn, records: Sequence[IngressRecord]) -> list[Outcome]:
    """Append records in one transaction; durable when this returns."""
    if not records:
        return []
    now = datetime.now(UTC)
    params = [_params(rec, now) for rec in records]
    # Sorted: two transactions lock their shared sources in one order, so they never deadlock.
    sources = sorted({rec.source_key for rec in records})
    async with translate(), conn.transaction():
        async with conn.cursor() as cur:
            await cur.execute(Q["ingress_source_append_lock"], {"sources": sources})
            # One pipelined round trip for the whole batch, one result set per record.
            await cur.executemany(Q["ingress_append"], params, returning=True)
            rows = [await cur.fetchone()]
            while cur.nextset():
                rows.append(await cur.fetchone())
        return [await _outcome(conn, p, row) for p, row in zip(params, rows, strict=True)]


@dataclass
class _Pending:
    record: IngressRecord
    future: asyncio.Future[Outcome]


@dataclass
class GroupCommitter:
    """Coalesces concurrent appends into few transactions (group commit)."""

    pool: AsyncConnectionPool[Conn]
    max_batch: int = 128
    workers: int = 4
    _queue: asyncio.Queue[_Pending] = field(default_factory=asyncio.Queue)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()) for _ in range(self.workers)]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait().future.set_exception(asyncio.CancelledError())

    async def submit(self, record: IngressRecord) -> Outcome:
        """Append one record; returns after the transaction holding it commits."""
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(record, fut))
        return await fut

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._commit(batch)

    async def _commit(self, batch: list[_Pending]) -> None:
        try:
            async with self.pool.connection() as conn:
                outcomes = await append(conn, [p.record for p in batch])
        except Exception as exc:
            if len(batch) > 1 and not isinstance(exc, DatabaseUnavailable):
                # One bad record must not fail its neighbours: retry them one by one.
                for p in batch:
                    await self._commit([p])
                return
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        for p, outcome in zip(batch, outcomes, strict=True):
            if not p.future.done():
                p.future.set_result(outcome)
