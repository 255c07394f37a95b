"""The driver's local durable outbox (SPEC §6.3): events wait here, in seq order, until the
bus answers them. SQLite in WAL mode with synchronous=FULL: every commit is fsynced, so an
enqueued event survives a crash of the driver.
"""

from __future__ import annotations

import contextlib
import enum
import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    source_key   TEXT NOT NULL,
    dedupe_key   TEXT NOT NULL,
    type         TEXT NOT NULL,
    envelope     BLOB NOT NULL,
    body_ref     TEXT NOT NULL,
    chain_id     TEXT NOT NULL,
    hop          INTEGER NOT NULL,
    causation_id TEXT NOT NULL,
    enqueued_at  REAL NOT NULL,
    rejected_at  REAL,
    reason       TEXT
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (seq) WHERE rejected_at IS NULL;
CREATE TABLE IF NOT EXISTS outbox_state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
EVENT_COLUMNS = "seq, source_key, dedupe_key, type, envelope, body_ref, chain_id, hop, causation_id"
OUTBOX_INSERT = """
INSERT INTO outbox (source_key, dedupe_key, type, envelope, body_ref, chain_id, hop,
                    causation_id, enqueued_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
OUTBOX_UNACKED = f"""
SELECT {EVENT_COLUMNS} FROM outbox
WHERE rejected_at IS NULL AND seq > ? ORDER BY seq LIMIT ?
"""
OUTBOX_REJECTED = f"""
SELECT {EVENT_COLUMNS}, reason FROM outbox
WHERE rejected_at IS NOT NULL AND seq > ? ORDER BY seq LIMIT ?
"""
OUTBOX_MARK_REJECTED = """
UPDATE outbox SET rejected_at = ?, reason = ? WHERE seq = ? AND rejected_at IS NULL
"""
OUTBOX_DELETE_ACKED = "DELETE FROM outbox WHERE seq = ? AND rejected_at IS NULL"
OUTBOX_PENDING_COUNT = "SELECT count(*) FROM outbox WHERE rejected_at IS NULL"
# Settled = every seq up to here was answered: one below the oldest unanswered event, else the
# highest seq ever assigned (AUTOINCREMENT never reuses a seq, even after deletes).
OUTBOX_ACKED_THROUGH = """
SELECT coalesce(
    (SELECT min(seq) - 1 FROM outbox WHERE rejected_at IS NULL),
    (SELECT seq FROM sqlite_sequence WHERE name = 'outbox'),
    0)
"""
STATE_GET = "SELECT value FROM outbox_state WHERE key = ?"
STATE_RAISE = """
INSERT INTO outbox_state (key, value) VALUES (?, ?)
ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)
"""
LAST_ACKED = "last_acked_seq"


class AckStatus(enum.StrEnum):
    """The bus's answer to one event."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


@dataclass(frozen=True)
class OutboxEvent:
    """One event waiting in the outbox, as it goes on the wire."""

    seq: int
    source_key: str
    dedupe_key: str
    type: str
    envelope: bytes
    body_ref: str = ""
    chain_id: str = ""
    hop: int = 0
    causation_id: str = ""


@dataclass(frozen=True)
class AckResult:
    """One Ack as the outbox records it."""

    seq: int
    status: AckStatus
    reason: str = ""
    ingress_id: int = 0


@dataclass(frozen=True)
class RejectedEvent:
    """An event the bus refused, kept with the reason for the operator."""

    event: OutboxEvent
    reason: str


def encode_envelope(envelope: Mapping[str, Any] | bytes) -> bytes:
    """The envelope's bytes on the wire: compact UTF-8 JSON for a mapping."""
    if isinstance(envelope, bytes):
        return envelope
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode()


class DriverOutbox:
    """A local durable queue of events for the bus, in seq order (thread-safe)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # FULL: a commit is fsynced, so an enqueued event survives a crash of the driver.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(OUTBOX_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def enqueue(
        self,
        source_key: str,
        dedupe_key: str,
        type: str,
        envelope: Mapping[str, Any] | bytes,
        body_ref: str = "",
        chain_id: str = "",
        hop: int = 0,
        causation_id: str = "",
    ) -> int:
        """Store one event durably; returns its seq (greater than every earlier one)."""
        if not source_key or not dedupe_key or not type:
            raise ValueError("source_key, dedupe_key and type are required")
        row = (source_key, dedupe_key, type, encode_envelope(envelope), body_ref, chain_id, hop)
        with self._lock:
            cur = self._db.execute(OUTBOX_INSERT, (*row, causation_id, time.time()))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def unacked(self, after_seq: int = 0, limit: int = 1000) -> list[OutboxEvent]:
        """Events not yet answered by the bus with seq > after_seq, in seq order."""
        with self._lock:
            rows = self._db.execute(OUTBOX_UNACKED, (after_seq, limit)).fetchall()
        return [OutboxEvent(*row) for row in rows]

    def rejected(self, after_seq: int = 0, limit: int = 1000) -> list[RejectedEvent]:
        """Events the bus rejected, with its reasons, in seq order."""
        with self._lock:
            rows = self._db.execute(OUTBOX_REJECTED, (after_seq, limit)).fetchall()
        return [RejectedEvent(OutboxEvent(*row[:-1]), row[-1]) for row in rows]

    def ack(self, seq: int, status: AckStatus, reason: str = "") -> bool:
        """Record the bus's answer for one seq; False if it was not waiting for one."""
        return self.ack_many([AckResult(seq, status, reason)]) > 0

    def ack_many(self, results: Iterable[AckResult]) -> int:
        """Record answers in one transaction; returns how many were waiting for one.

        Accepted and duplicate events leave the outbox; rejected ones stay, with the reason.
        """
        recorded, highest, now = 0, 0, time.time()
        with self._transaction() as db:
            for r in results:
                if r.status is AckStatus.REJECTED:
                    cur = db.execute(OUTBOX_MARK_REJECTED, (now, r.reason, r.seq))
                else:
                    cur = db.execute(OUTBOX_DELETE_ACKED, (r.seq,))
                if cur.rowcount:
                    recorded += 1
                    highest = max(highest, r.seq)
            if highest:
                db.execute(STATE_RAISE, (LAST_ACKED, highest))
        return recorded

    def last_acked_seq(self) -> int:
        """The highest seq the bus has answered (0 if none)."""
        with self._lock:
            row = self._db.execute(STATE_GET, (LAST_ACKED,)).fetchone()
        return int(row[0]) if row else 0

    def acked_through(self) -> int:
        """The highest seq such that it and every earlier seq have been answered."""
        with self._lock:
            return int(self._db.execute(OUTBOX_ACKED_THROUGH).fetchone()[0])

    def pending_count(self) -> int:
        """How many events still wait for an answer."""
        with self._lock:
            return int(self._db.execute(OUTBOX_PENDING_COUNT).fetchone()[0])
