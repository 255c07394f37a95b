"""Timeline entries written from code: a turn's start (its inputs are known only to the turn)
and a tool call that failed for good (its activity never committed a row)."""

from __future__ import annotations

from eventos.contracts import ToolFailed, TurnInput
from eventos.db import Conn
from eventos.db.sql import Q


async def turn_started(conn: Conn, turn: TurnInput) -> None:
    """The turn's `started` entry with its inputs' chains (once per turn: a retried load
    writes nothing)."""
    chains = list(dict.fromkeys(i.chain_id for i in turn.inputs))
    await conn.execute(Q["timeline_turn_started"], {
        "turn_id": turn.turn_id, "chains": chains, "inputs": len(turn.inputs),
    })  # fmt: skip


async def tool_failed(conn: Conn, req: ToolFailed) -> None:
    """A tool call's `failed` entry with its cause (once per call: a retried write adds none)."""
    await conn.execute(Q["timeline_tool_failed"], {
        "turn_id": req.turn_id, "ref": f"{req.turn_id}:{req.call_id}", "tool": req.tool,
        "error": req.error[:500],
    })  # fmt: skip
