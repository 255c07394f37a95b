"""Places in the event streams (docs/events.md): the sequencer that makes them gapless.

Chat and operator events are written without a place (`pos` NULL) by whoever records the
change. `place` gives committed ones the next places from one sequence, under an advisory lock,
in a transaction of its own; the streams read `pos > last`. An event whose transaction is still
open is invisible to it, so it is placed after everything placed before it commits: a reader
never passes it, and never reads it twice. Reading by id instead would skip it (an identity is
taken at insert, and transactions commit out of that order).

Why it holds: runs are serialized by the lock and each takes its snapshot after the previous
run committed, so places grow run by run; a run's places become visible all at once, and only
after the previous run's (its commit follows their release of the lock). So whatever place a
reader sees, it sees every lower one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eventos.db import Conn
from eventos.db.sql import Q

BATCH = 1000  # events of each table placed per transaction


@dataclass
class Placed:
    """What a run placed: operator events, and chat events by employee."""

    operator: int = 0
    chat: int = 0
    chat_employees: set[str] = field(default_factory=set)

    def add(self, other: Placed) -> None:
        self.operator += other.operator
        self.chat += other.chat
        self.chat_employees |= other.chat_employees


async def place_batch(conn: Conn, limit: int = BATCH) -> Placed:
    """Place up to `limit` committed events of each table, in one transaction."""
    async with conn.transaction():
        await conn.execute(Q["event_positions_lock"])
        cur = await conn.execute(Q["event_positions_assign"], {"limit": limit})
        row = await cur.fetchone() or {}
    return Placed(int(row["operator"]), int(row["chat"]), set(row["chat_employees"]))


async def place(conn: Conn) -> Placed:
    """Place every committed event that has no place yet, a batch at a time."""
    placed = Placed()
    while True:
        batch = await place_batch(conn)
        placed.add(batch)
        if batch.operator < BATCH and batch.chat < BATCH:
            return placed
