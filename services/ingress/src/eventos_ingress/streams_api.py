"""Server-sent event streams of the owner API: the operator stream (`GET /v1/events`) and a chat
session's (`GET /v1/employees/{name}/chat/events`); docs/events.md.

Both read events by their place (`eventos.owner.event_positions`), so a client resuming with
`Last-Event-ID` (or `?after=`) gets every event after the last it read, once. A stream reads
when the sequencer placed events it may show (LISTEN/NOTIFY through `StreamWakeups`), else
every 250 ms while nobody listens, and every 5 s regardless; it sends a keep-alive comment after
15 quiet seconds, with the place it is at (`id:`: a reconnect goes on from there). It ends when
the database is unavailable or the service stops (the client reconnects with Last-Event-ID).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Scope

from eventos import names
from eventos.db import Conn, translate
from eventos.employees import lifecycle
from eventos.errors import DatabaseUnavailable
from eventos.operator import events
from eventos.operator.attention import Caller
from eventos.owner import chat
from eventos.owner.wakeups import OPERATOR, StreamWakeups
from eventos_ingress import problems

SSE_POLL_S = 0.25  # while no listener hears placed events
SSE_RECHECK_S = 5.0  # while one does (its wake-ups are hints)
SSE_KEEPALIVE_S = 15.0
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
# The streams' paths: their requests have their own in-flight cap (each stays open).
STREAM_PATH = re.compile(r"/v1/events|/v1/employees/[^/]+/chat/events")


def is_stream(scope: Scope) -> bool:
    """Whether a request is for one of the event streams."""
    return STREAM_PATH.fullmatch(scope["path"]) is not None


# One read of a stream: the frames to send, the place it is at after them, whether to read
# again at once.
Reading = tuple[list[str], int, bool]
ReadFn = Callable[[Conn, int], Awaitable[Reading]]


def frame(place: int, kind: str, doc: dict[str, object]) -> str:
    """One server-sent event."""
    return f"id: {place}\nevent: {kind}\ndata: {json.dumps(doc, separators=(',', ':'))}\n\n"


def _after(request: Request) -> str | None:
    """The place the client read last: Last-Event-ID (a reconnect), else `?after=`."""
    return request.headers.get("last-event-id") or request.query_params.get("after")


@dataclass
class StreamsApi:
    """The owner API's event streams."""

    pool: AsyncConnectionPool[Conn]
    wakeups: StreamWakeups  # wakes the streams when the sequencer placed events

    async def operator(self, request: Request, caller: Caller) -> Response:
        """State changes of the caller's audience (admin: all) as server-sent events."""
        reader = events.Reader(caller.audience, caller.admin,
                               request.query_params.get("employee") or None,
                               events.parse_kinds(request.query_params.get("kind")),
                               caller.since)  # fmt: skip
        raw = _after(request)
        given = None if raw is None else events.parse_place(raw, "Last-Event-ID")
        async with self.pool.connection() as conn:
            after = await events.start(conn, given)  # refused before the stream starts

        async def read(conn: Conn, after: int) -> Reading:
            found = await events.read(conn, reader, after)
            frames = [frame(int(r["pos"]), r["kind"], events.view(r, caller.admin))
                      for r in found.events]  # fmt: skip
            return frames, found.last, found.more

        return self._respond(request, OPERATOR, after, read)

    async def chat(self, request: Request, caller: Caller) -> Response:
        """Server-sent events of one chat session (its audience's content only)."""
        name = request.path_params["name"]
        session = request.query_params.get("session", names.DEFAULT_SESSION)
        after = events.parse_place(_after(request) or "0", "after")
        async with self.pool.connection() as conn:
            await lifecycle.get(conn, name)  # 404 before the stream starts

        async def read(conn: Conn, after: int) -> Reading:
            rows = await chat.events_after(conn, name, session, after, caller.audience,
                                           caller.since or chat.EPOCH)  # fmt: skip
            frames = []
            for row in rows:
                after = int(row["pos"])
                doc: dict[str, object] = {"id": row["id"], "turn_id": row["turn_id"]}
                if row["kind"] in (names.RUN_REPLY, names.RUN_NOTICE):
                    doc["text"] = row["text"]
                else:
                    doc["message_ids"] = list(row["message_ids"])
                frames.append(frame(after, row["kind"], doc))
            return frames, after, False

        return self._respond(request, name, after, read)

    def _respond(self, request: Request, topic: str, after: int, read: ReadFn) -> Response:
        stream = self._stream(request, topic, after, read)
        return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)

    async def _stream(
        self, request: Request, topic: str, after: int, read: ReadFn
    ) -> AsyncIterator[str]:
        yield f": connected\nid: {after}\n\n"
        quiet_since = time.monotonic()
        with self.wakeups.subscribe(topic) as woken:
            while not (self.wakeups.closed or await request.is_disconnected()):
                woken.clear()  # before the read: a wake during it means read again
                try:
                    async with translate(), self.pool.connection() as conn:
                        frames, after, more = await read(conn, after)
                except DatabaseUnavailable:
                    yield f"retry: {problems.RETRY_AFTER_S * 1000}\n: database unavailable\n\n"
                    return
                for f in frames:
                    yield f
                if frames:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= SSE_KEEPALIVE_S:
                    quiet_since = time.monotonic()
                    yield f": keep-alive\nid: {after}\n\n"
                if more:
                    continue
                wait = SSE_RECHECK_S if self.wakeups.listening else SSE_POLL_S
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), wait)
