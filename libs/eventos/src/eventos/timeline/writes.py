"""Timeline entries written from code: a turn's start (its inputs are known only to the turn)."""

from __future__ import annotations

from eventos.contracts import TurnInput
from eventos.db import Conn
from eventos.db.sql import Q


async def turn_started(conn: Conn, turn: TurnInput) -> None:
    """The turn's `started` entry with its inputs' chains (once per turn: a retried load
    writes nothing)."""
    chains = list(dict.fromkeys(i.chain_id for i in turn.inputs))
    await conn.execute(Q["timeline_turn_started"], {
        "turn_id": turn.turn_id, "chains": chains, "inputs": len(turn.inputs),
    })  # fmt: skip
