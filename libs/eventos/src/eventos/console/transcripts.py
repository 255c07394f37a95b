"""A turn's transcript for the console's admin-only, opt-in transcript view: what the model was
asked in the turn (its inputs as the model read them, the tool results it was given) and what
it answered (its replies and tool calls), from the messages the turn's consuming save appended.

Reading it writes a `transcript.viewed` entry on the employee's timeline (who, when), in the
read's own transaction: no transcript leaves without its entry. Bounded: the first 200
messages, each cut at 20,000 characters. A conversation keeps its newest 1 MB of messages, so
an old turn's may be gone; a turn that failed saved none."""

from __future__ import annotations

from typing import Any

from eventos.console import reads
from eventos.db import Conn
from eventos.db.sql import Q

MESSAGES_MAX = 200
CHARS_MAX = 20_000


def _cut(text: Any) -> tuple[str, bool]:
    value = "" if text is None else str(text)
    return value[:CHARS_MAX], len(value) > CHARS_MAX


def message_view(n: int, doc: dict[str, Any]) -> dict[str, Any]:
    """One stored message as the view shows it: role, text, tool calls (name and arguments)."""
    content, cut = _cut(doc.get("content"))
    calls = []
    for call in doc.get("tool_calls") or []:
        arguments, cut_args = _cut(call.get("arguments"))
        cut = cut or cut_args
        calls.append({"id": call.get("id"), "name": call.get("name"), "arguments": arguments})
    return {"n": n, "role": doc.get("role"), "content": content, "tool_calls": calls,
            "tool_call_id": doc.get("tool_call_id"), "name": doc.get("name"),
            "truncated": cut}  # fmt: skip


async def read(conn: Conn, employee: str, turn_id: str, by: str) -> dict[str, Any]:
    """The turn's messages, its view recorded on the timeline as `by`'s; NotFound for a turn
    the employee does not have."""
    async with conn.transaction():
        turn = await reads.turn(conn, employee, turn_id)
        params = {"employee": employee, "generation": turn["generation"],
                  "agent": turn["agent"], "thread": turn["thread"], "turn_id": turn_id,
                  "cap": MESSAGES_MAX + 1}  # fmt: skip
        cur = await conn.execute(Q["console_turn_transcript"], params)
        rows = await cur.fetchall()
        messages = [message_view(int(r["n"]), r["message"]) for r in rows[:MESSAGES_MAX]]
        await conn.execute(Q["console_transcript_viewed"], {
            "employee": employee, "turn_id": turn_id, "by": by, "messages": len(messages),
        })  # fmt: skip
    return {"turn": turn, "messages": messages, "messages_capped": len(rows) > MESSAGES_MAX}
