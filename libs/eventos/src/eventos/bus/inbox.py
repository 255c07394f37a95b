"""The bus contract (SPEC §5): append, then route. Producers and the router never see SQL.

`append` is durable on return. `GroupCommitter` coalesces concurrent appends into one
transaction; no caller is answered before the transaction holding its row commits.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.db import Conn, translate
from eventos.db.sql import Q
from eventos.errors import DatabaseUnavailable, QueueFull, RecordInvalid

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


def bounded_dedupe_key(key: str) -> str:
    """The key itself, or a stable hash of it when it is longer than DEDUPE_KEY_MAX_BYTES or
    holds text PostgreSQL cannot store (no index overflows; a resend of the same key hashes to
    the same value, so it is still a duplicate)."""
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        raw = b"\x00"
    if len(raw) <= names.DEDUPE_KEY_MAX_BYTES and b"\x00" not in raw:
        return key
    return names.LONG_KEY_PREFIX + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _row(rec: IngressRecord) -> dict[str, object]:
    """One record as an element of ingress_append's jsonb array."""
    return {
        "source_key": rec.source_key,
        "dedupe_key": bounded_dedupe_key(rec.dedupe_key),
        "type": rec.type,
        "class": rec.klass,
        "ttl_s": rec.dedupe_ttl_s,
        "envelope": rec.envelope,
        "body_ref": rec.body_ref,
        "size": rec.size,
        "chain_id": rec.chain_id,
        "hop": rec.hop,
        "causation_id": rec.causation_id,
        "path": rec.path,
        "status": rec.status,
        "error": rec.error,
    }


def _outcome(row: dict[str, Any]) -> Outcome:
    if row["id"] is None:
        # Unreachable: the per-source lock precedes the statement, so an earlier row of the
        # key is in its snapshot. Never mistake a duplicate for a loss.
        raise RuntimeError("the dedupe row of a duplicate was not found")
    return Accepted(int(row["id"])) if row["accepted"] else Duplicate(int(row["id"]))


async def append(conn: Conn, records: Sequence[IngressRecord]) -> list[Outcome]:
    """Append records in one transaction; durable when this returns."""
    if not records:
        return []
    # The whole batch is one statement with one jsonb parameter: the rows are expanded,
    # deduplicated and inserted in the database (the client encodes one JSON document).
    params = {"records": Jsonb([_row(rec) for rec in records]), "received_at": datetime.now(UTC)}
    # Sorted: two transactions lock their shared sources in one order, so they never deadlock.
    sources = sorted({rec.source_key for rec in records})
    async with translate(), conn.transaction(), conn.cursor() as cur:
        await cur.execute(Q["ingress_source_append_lock"], {"sources": sources})
        await cur.execute(Q["ingress_append"], params)
        rows = await cur.fetchall()
    return [_outcome(row) for row in rows]


async def append_isolated(conn: Conn, records: Sequence[IngressRecord]) -> list[Outcome]:
    """Append like `append`, but a record whose own data cannot be stored is `Rejected` alone:
    a failed batch is split in halves and each half retried in its own transaction (one bad
    record costs about 2·log2(n) extra transactions). Connection errors still raise."""
    try:
        return await append(conn, records)
    except RecordInvalid as exc:
        if len(records) == 1:
            return [Rejected(str(exc))]
    half = len(records) // 2
    return [*await append_isolated(conn, records[:half]),
            *await append_isolated(conn, records[half:])]  # fmt: skip


@dataclass
class _Pending:
    record: IngressRecord
    future: asyncio.Future[Outcome]


@dataclass
class GroupCommitter:
    """Coalesces concurrent appends into few transactions (group commit).

    Bounded (I3): past `max_queue` waiting records `submit` raises QueueFull at once (the
    caller answers 503 with Retry-After). A record whose own data cannot be stored never fails
    its neighbours (`append_isolated`); a connection error fails the whole batch.
    """

    pool: AsyncConnectionPool[Conn]
    max_batch: int = 128
    workers: int = 4
    max_queue: int = names.COMMIT_QUEUE_MAX
    _queue: asyncio.Queue[_Pending] = field(init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue = asyncio.Queue(self.max_queue)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()) for _ in range(self.workers)]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait().future.set_exception(asyncio.CancelledError())

    @property
    def depth(self) -> int:
        """Records waiting for a transaction."""
        return self._queue.qsize()

    async def submit(self, record: IngressRecord) -> Outcome:
        """Append one record; returns after the transaction holding it commits."""
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Pending(record, fut))
        except asyncio.QueueFull:
            raise QueueFull(f"the commit queue is full ({self.max_queue} records)") from None
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
                outcomes = await append_isolated(conn, [p.record for p in batch])
        except Exception as exc:
            if not isinstance(exc, DatabaseUnavailable):
                log.warning("append failed: %r", exc)
                exc = DatabaseUnavailable(f"append failed: {type(exc).__name__}")
            _fail(batch, exc)
            return
        for p, outcome in zip(batch, outcomes, strict=True):
            if not p.future.done():
                p.future.set_result(outcome)


def _fail(batch: list[_Pending], exc: Exception) -> None:
    for p in batch:
        if not p.future.done():
            p.future.set_exception(exc)
