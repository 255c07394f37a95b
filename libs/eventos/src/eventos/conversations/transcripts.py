"""Transcripts (SPEC §8, I7): a conversation's messages as rows, out of Temporal's payloads.

The consuming save appends a turn's messages (`append`, in its transaction); a turn loads only
the transcript's version (`TranscriptRef`: message count and byte total), and each LLM step
reads the newest stored messages within I7's bound by that version (`RecentMessages.resolve`).
Rows are only appended, so every attempt of a step reads the same messages, a worker reads only
the rows it has not seen, and a turn costs the same on the first message of a conversation as
on the five-hundredth. The stored transcript keeps within
1 MB: past that its oldest rows are deleted (compaction will summarize them instead).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from psycopg.types.json import Jsonb

from eventos import names
from eventos.bus.jsonsafe import storable_text
from eventos.contracts import (
    ChatMessage,
    LlmStepInput,
    ToolCall,
    TranscriptRef,
    message_size,
)
from eventos.db import Conn
from eventos.db.sql import Q

STORED_MAX_BYTES = 1_000_000
CACHED_CONVERSATIONS = 64  # per LLM worker process (RecentMessages)


def message_of(doc: dict[str, Any]) -> ChatMessage:
    calls = [ToolCall(**c) for c in doc.get("tool_calls") or []]
    return ChatMessage(doc["role"], doc.get("content") or "", calls, doc.get("tool_call_id"),
                       doc.get("name"))  # fmt: skip


def storable(message: ChatMessage) -> ChatMessage:
    """The message with text PostgreSQL cannot store (NUL) replaced by U+FFFD: model output
    may hold anything, and a save that fails on every attempt would wedge the turn."""
    calls = [ToolCall(storable_text(c.id), storable_text(c.name), storable_text(c.arguments))
             for c in message.tool_calls]  # fmt: skip
    return dataclasses.replace(
        message, content=storable_text(message.content), tool_calls=calls,
        tool_call_id=None if message.tool_call_id is None else storable_text(message.tool_call_id),
        name=None if message.name is None else storable_text(message.name),
    )  # fmt: skip


def _key(employee: str, ref: TranscriptRef) -> dict[str, object]:
    return {"employee": employee, "generation": ref.generation, "agent": ref.agent,
            "thread": ref.thread}  # fmt: skip


async def append(conn: Conn, employee: str, ref: TranscriptRef, turn_id: str,
                 messages: list[ChatMessage]) -> TranscriptRef:  # fmt: skip
    """Append a turn's messages (inside the caller's transaction) and prune the oldest past
    1 MB; the transcript's new version. `ref` names the conversation (its version is read
    again under the row's lock)."""
    key = _key(employee, ref)
    cur = await conn.execute(Q["transcript_head"], key)
    head = await cur.fetchone()
    if head is None:
        raise LookupError(f"no conversation {employee}/{ref.agent}/{ref.thread}")
    n, total = int(head["transcript_n"]), int(head["transcript_total"])
    rows: dict[str, list[Any]] = {"n": [], "start_bytes": [], "bytes": [], "message": []}
    for message in messages:
        size = message_size(message)
        n += 1
        rows["n"].append(n)
        rows["start_bytes"].append(total)
        rows["bytes"].append(size)
        rows["message"].append(Jsonb(asdict(message)))
        total += size
    if messages:
        await conn.execute(Q["transcript_append"], {**key, **rows, "turn_id": turn_id})
        head = {**key, "n": n, "total": total, "keep_from": total - STORED_MAX_BYTES}
        await conn.execute(Q["transcript_advance"], head)
    return dataclasses.replace(ref, through=n, through_bytes=total)


@dataclass(frozen=True)
class _Window:
    """A conversation's newest stored messages (within I7's bound) as of version `through`."""

    through: int
    starts: list[int]  # each message's start_bytes, ascending
    messages: list[ChatMessage]


class RecentMessages:
    """The newest stored messages of the conversations an LLM worker served lately. Rows are
    only appended, so a step of the next version reads just the rows after the last one it
    saw, not the whole window again (an LRU of `size` conversations, each ≤ 393,216 bytes)."""

    def __init__(self, size: int = CACHED_CONVERSATIONS) -> None:
        self.size = size
        self._windows: OrderedDict[tuple[str, int, str, str], _Window] = OrderedDict()

    async def read(self, conn: Conn, employee: str, ref: TranscriptRef,
                   limit: int = names.TRANSCRIPT_MAX_BYTES) -> list[ChatMessage]:  # fmt: skip
        """The newest messages of version `ref` whose JSON fits in `limit` bytes (≤ I7's
        bound), never starting with a tool result (it means nothing without its call)."""
        if ref.through == 0 or limit <= 0:
            return []
        key = (employee, ref.generation, ref.agent, ref.thread)
        floor = ref.through_bytes - names.TRANSCRIPT_MAX_BYTES  # what a window keeps
        known = self._windows.get(key)
        if known is not None and known.through > ref.through:  # an older version: read it alone
            known = None
            keep = False
        else:
            keep = True
        after = known.through if known is not None else 0
        params = {**_key(employee, ref), "after": after, "through": ref.through, "floor": floor}
        async with conn.transaction():  # ends here: the caller's next writes commit on their own
            cur = await conn.execute(Q["transcript_recent"], params)
            rows = await cur.fetchall()
        starts = (known.starts if known else []) + [int(r["start_bytes"]) for r in rows]
        messages = (known.messages if known else []) + [message_of(r["message"]) for r in rows]
        cut = bisect.bisect_left(starts, floor)
        window = _Window(ref.through, starts[cut:], messages[cut:])
        if keep:
            self._windows[key] = window
            self._windows.move_to_end(key)
            while len(self._windows) > self.size:
                self._windows.popitem(last=False)
        kept = window.messages[bisect.bisect_left(window.starts, ref.through_bytes - limit) :]
        while kept and kept[0].role == "tool":
            kept = kept[1:]
        return kept

    async def resolve(self, conn: Conn, step: LlmStepInput) -> LlmStepInput:
        """The step with its stored transcript read in after the system prompt: the newest
        stored messages that fit beside the prompt and the turn's own within I7's bound."""
        if step.transcript is None:
            return step
        head = step.messages[:1] if step.messages and step.messages[0].role == "system" else []
        own = step.messages[len(head) :]
        room = names.TRANSCRIPT_MAX_BYTES - sum(message_size(m) for m in step.messages)
        stored = await self.read(conn, step.employee, step.transcript, room)
        return dataclasses.replace(step, messages=head + stored + own, transcript=None)
