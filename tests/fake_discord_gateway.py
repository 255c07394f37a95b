"""The fake Discord's gateway: a real websocket server speaking JSON opcodes 0 DISPATCH, 1/11
HEARTBEAT/ACK, 2 IDENTIFY, 6 RESUME, 7 RECONNECT, 9 INVALID SESSION and 10 HELLO with Discord's
close codes. Each session numbers its events (`s`) and keeps them for RESUME, which replays the
events after the given seq in order, then RESUMED. A connection that misses its heartbeat is
closed with 4009 and its session stays resumable (the gateway page: "forced to Resume"); a client
closing with 1000/1001 ends its session. Session expiry runs on the owner's clock.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

HEARTBEAT_MS = 41_250
PAYLOAD_MAX = 4096  # bytes a client may send in one payload
REPLAY_MAX = 1000  # events a session keeps for RESUME
SESSION_TTL_S = 120.0  # a disconnected session can be resumed this long
SEND_TIMEOUT_S = 5.0
GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT = 1 << 9, 1 << 12, 1 << 15
INTENTS_MAX = (1 << 26) - 1
CLOSE_REASONS = {
    4000: "Unknown error.", 4001: "Unknown opcode.", 4002: "Error while decoding payload.",
    4003: "Not authenticated.", 4004: "Authentication failed.", 4005: "Already authenticated.",
    4007: "Invalid seq.", 4009: "Session timed out.", 4012: "Invalid API version.",
    4013: "Invalid intent(s).",
}  # fmt: skip
CLIENT_OPS = {1, 2, 3, 4, 6, 8, 31}  # opcodes a client may send


@dataclass
class Session:
    id: str
    intents: int
    seq: int = 0
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=REPLAY_MAX))
    evicted_seq: int = 0  # the newest seq no longer kept for replay
    conn: ServerConnection | None = None
    disconnected_at: float | None = None
    valid: bool = True
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class FakeGateway:
    def __init__(
        self, token: str, bot_user: dict[str, Any], guild_ids: list[str], clock: Callable[[], float]
    ) -> None:
        self.token, self.bot_user, self.guild_ids, self.clock = token, bot_user, guild_ids, clock
        self.sessions: dict[str, Session] = {}
        self.heartbeat_interval_ms = HEARTBEAT_MS
        self.session_ttl_s = SESSION_TTL_S
        self.paths: list[str] = []  # the request path of every connection
        self.identifies = self.resumes = self.heartbeats = self.port = 0
        self._server: Server | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def resume_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/resume"

    async def start(self) -> None:
        self._server = await serve(
            self._connection, "127.0.0.1", 0, ping_interval=None, compression=None
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await asyncio.wait_for(self._server.wait_closed(), 10)

    async def drop_connection(self, code: int | None = 4000) -> None:
        """Close every gateway connection (a resumable code; None: cut TCP); sessions stay."""
        for session in self.sessions.values():
            async with session.lock:
                conn, session.conn, session.disconnected_at = session.conn, None, self.clock()
            if conn is not None and code is None:
                conn.transport.abort()
            if conn is not None and code is not None:
                await conn.close(code, CLOSE_REASONS.get(code, ""))

    async def request_reconnect(self) -> None:
        """Op 7 RECONNECT to every connection, then close it: the client must RESUME."""
        for session in self.sessions.values():
            async with session.lock:
                if session.conn is not None:
                    await self._send(session.conn, {"op": 7, "d": None, "s": None, "t": None})
        await self.drop_connection(4000)

    async def expire_sessions(self) -> None:
        """Sessions end (close 4009); a later RESUME gets op 9 INVALID SESSION."""
        for session in self.sessions.values():
            session.valid = False
        await self.drop_connection(4009)

    def live_sessions(self) -> list[Session]:
        """Sessions with a connection open now."""
        return [s for s in self.sessions.values() if s.conn is not None]

    async def broadcast(self, guild_id: str | None, message: dict[str, Any]) -> None:
        """MESSAGE_CREATE to every session whose intents ask for it (kept for RESUME)."""
        needed = GUILD_MESSAGES if guild_id else DIRECT_MESSAGES
        for session in list(self.sessions.values()):
            if not session.valid or not session.intents & needed:
                continue
            event = dict(message) | ({"guild_id": guild_id} if guild_id else {})
            mine = message["author"]["id"] == self.bot_user["id"]
            if guild_id and not mine and not session.intents & MESSAGE_CONTENT:
                event |= {"content": "", "embeds": [], "attachments": [], "components": []}
            async with session.lock:
                await self._dispatch(session, "MESSAGE_CREATE", event, keep=True)

    async def _dispatch(self, session: Session, name: str, data: Any, *, keep: bool) -> None:
        """One op 0 event with the session's next `s` (call with session.lock held)."""
        session.seq += 1
        event = {"op": 0, "d": data, "s": session.seq, "t": name}
        if keep:
            if len(session.events) == REPLAY_MAX:
                session.evicted_seq = session.events[0]["s"]
            session.events.append(event)
        if session.conn is not None and not await self._send(session.conn, event):
            session.conn, session.disconnected_at = None, self.clock()

    async def _send(self, conn: ServerConnection, payload: dict[str, Any]) -> bool:
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await conn.send(json.dumps(payload))
            return True
        except (ConnectionClosed, TimeoutError):
            conn.transport.abort()
            return False

    async def _connection(self, ws: ServerConnection) -> None:
        path = ws.request.path if ws.request else "/"
        self.paths.append(path)
        query = parse_qs(urlsplit(path).query)
        if query.get("v", ["10"]) != ["10"]:
            return await ws.close(4012, CLOSE_REASONS[4012])
        if query.get("encoding", ["json"]) != ["json"]:  # the fake speaks JSON only
            return await ws.close(4002, CLOSE_REASONS[4002])
        interval = self.heartbeat_interval_ms / 1000
        await self._send(ws, {"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval_ms}, "s": None, "t": None})  # fmt: skip
        beat_by = time.monotonic() + interval * 1.5  # first beat after interval * jitter
        session: Session | None = None
        try:
            while True:
                try:
                    async with asyncio.timeout(max(0.0, beat_by - time.monotonic())):
                        raw = await ws.recv()
                except TimeoutError:
                    return await ws.close(4009, CLOSE_REASONS[4009])  # no heartbeat in time
                close, session, beat = await self._on_payload(ws, raw, session)
                if close is not None:
                    return await ws.close(close, CLOSE_REASONS[close])
                if beat:
                    beat_by = time.monotonic() + interval * 1.5
        except ConnectionClosed:
            pass
        finally:
            if session is not None and session.conn is ws:
                session.conn, session.disconnected_at = None, self.clock()
                session.valid = ws.close_code not in (1000, 1001)  # the client ended its session

    async def _on_payload(
        self, ws: ServerConnection, raw: str | bytes, session: Session | None
    ) -> tuple[int | None, Session | None, bool]:
        """One client payload: (close code or None, the connection's session, was a heartbeat)."""
        if isinstance(raw, bytes) or len(raw.encode()) > PAYLOAD_MAX:
            return 4002, session, False
        try:
            payload = json.loads(raw)
            op, data = payload["op"], payload.get("d")
        except (ValueError, TypeError, KeyError):
            return 4002, session, False
        if op not in CLIENT_OPS:
            return 4001, session, False
        if op == 1:
            if data is not None and (not isinstance(data, int) or isinstance(data, bool)):
                return 4002, session, False
            self.heartbeats += 1
            await self._send(ws, {"op": 11})
            return None, session, True
        if op in (2, 6) and session is not None:
            return 4005, session, False
        if op not in (2, 6):
            return (4003 if session is None else None), session, False
        if not isinstance(data, dict) or data.get("token") != self.token:
            return 4004, session, False
        if op == 2:
            intents = data.get("intents")
            if not isinstance(intents, int) or isinstance(intents, bool) or not 0 <= intents <= INTENTS_MAX:  # fmt: skip
                return 4013, session, False
            return None, await self._identify(ws, intents), False
        close, resumed = await self._resume(ws, data)
        return close, resumed, False

    async def _identify(self, ws: ServerConnection, intents: int) -> Session:
        self.identifies += 1
        session = Session(secrets.token_hex(16), intents, conn=ws)
        self.sessions[session.id] = session
        ready = {"v": 10, "user": self.bot_user, "guilds": [{"id": g, "unavailable": True} for g in self.guild_ids],
                 "session_id": session.id, "resume_gateway_url": self.resume_url,
                 "shard": [0, 1], "application": {"id": self.bot_user["id"], "flags": 0}}  # fmt: skip
        async with session.lock:
            await self._dispatch(session, "READY", ready, keep=False)
        return session

    async def _resume(
        self, ws: ServerConnection, data: dict[str, Any]
    ) -> tuple[int | None, Session | None]:
        session, seq = self.sessions.get(str(data.get("session_id"))), data.get("seq")
        gone = session is not None and session.disconnected_at is not None and (
            self.clock() - session.disconnected_at > self.session_ttl_s)  # fmt: skip
        if session is None or not session.valid or gone or (isinstance(seq, int) and seq < session.evicted_seq):  # fmt: skip
            await self._send(ws, {"op": 9, "d": False, "s": None, "t": None})
            return None, None
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= session.seq:
            return 4007, None
        async with session.lock:
            old, session.conn, session.disconnected_at = session.conn, ws, None
            if old is not None and old is not ws:
                old.transport.abort()
            for event in list(session.events):
                if event["s"] > seq and not await self._send(ws, event):
                    session.conn, session.disconnected_at = None, self.clock()
                    return None, session
            await self._dispatch(session, "RESUMED", {}, keep=False)
        self.resumes += 1
        return None, session
