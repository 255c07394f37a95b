"""The Discord gateway reader (SPEC §6.4): channel messages over the bot's websocket session.

Discord does not redeliver what a connection missed unless it RESUMEs the session from the last
sequence number it processed. So the account's cursor is `{session_id, resume_url, seq}`, and it
commits with each page (one transaction, fenced by the lease): a reader that restarts, or the
replica that takes the lease over, RESUMEs from the committed seq and Discord replays what came
after it; a message read twice is a duplicate of its id. A session Discord refuses to resume
(INVALID SESSION) starts anew with IDENTIFY: what it sent in the gap is lost, as on Discord.

The websocket stays open across `read()` calls (one per account, by its credential), and is
driven only by them: each call heartbeats when due and returns a page as soon as messages came
(or after `wait_s`); a cancelled call drops the connection without ending the session, so the
next holder can resume it. A page whose commit failed is handed back by the next call (the
cursor it is given is the one before it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from eventos.bus.inbox import IngressRecord
from eventos.channels.discord import (
    DRIVER,
    DiscordApi,
    DiscordCredential,
    message_record,
    parse_credential,
)
from eventos.channels.readers import Page
from eventos.errors import EventOSError

log = logging.getLogger(__name__)
QUERY = "?v=10&encoding=json"
OPEN_TIMEOUT_S = 10.0
FRAME_MAX = 4 * 1024 * 1024  # READY of a large bot; a message is far smaller
QUEUE_MAX = 256  # frames buffered before the socket stops reading (TCP pushes back)
PAGE_MAX = 100
LINGER_S = 0.05  # after a message, how long more may join its page
# Close codes after which reconnecting cannot help (the gateway page): bad token, shard,
# API version or intents. The account is down until the operator fixes it.
FATAL_CLOSES = {
    4004: "authentication failed", 4010: "invalid shard", 4011: "sharding required",
    4012: "invalid API version", 4013: "invalid intents", 4014: "disallowed intents",
}  # fmt: skip
NEW_SESSION_CLOSES = {4007}  # invalid seq: resume cannot work; identify


class GatewayError(EventOSError):
    """The gateway refused the account (a fatal close code) or did not speak the protocol."""


@dataclass
class Gateway:
    """One open connection and the session it carries."""

    ws: ClientConnection
    session_id: str | None
    resume_url: str | None
    seq: int | None
    bot_id: str
    interval_s: float
    next_beat: float
    acked: bool = True

    def cursor(self) -> dict[str, Any]:
        if self.session_id is None:
            return {}
        return {"session_id": self.session_id, "resume_url": self.resume_url, "seq": self.seq}


@dataclass
class Held:
    """A page handed out and not yet known committed: `before` the cursor it was read from."""

    before: dict[str, Any]
    after: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)


class DiscordReader:
    """MESSAGE_CREATE events of each account's gateway session, a page per call."""

    driver = DRIVER
    # A session that stops reading misses its heartbeats and is closed; Discord replays only
    # a short window on RESUME. So the gateway reads on past the backlog bound (item raised).
    holds_unread = False

    def __init__(self, api: DiscordApi, wait_s: float, timeout_s: float = OPEN_TIMEOUT_S) -> None:
        self.api, self.wait_s, self.timeout_s = api, wait_s, timeout_s
        self.gateways: dict[str, Gateway] = {}
        self.held: dict[str, Held] = {}

    async def read(self, token: bytes, cursor: dict[str, Any], limit: int = PAGE_MAX) -> Page:
        """A page of the session's messages (`limit` is not applied: see `holds_unread`)."""
        cred = parse_credential(token)
        key = hashlib.sha256(token).hexdigest()
        held, gw = self.held.pop(key, None), self.gateways.get(key)
        items: list[dict[str, Any]] = []
        if held is not None and cursor == held.before:
            items = held.items  # the page did not commit: hand it out again
        elif held is None or cursor != held.after:
            self._drop(key)  # a cursor this connection did not make (another replica's)
            gw = None
        try:
            if gw is None:
                gw = await self._open(cred, cursor)
                self.gateways[key] = gw
            alive = await self._collect(cred, gw, items)
        except BaseException:  # cancelled, or the gateway failed: the session stays resumable
            self._drop(key)
            if items:  # still not committed: handed out again from this same cursor
                self.held[key] = Held(cursor, cursor, items)
            raise
        after = gw.cursor()
        if not alive:
            self._drop(key)
        self.held[key] = Held(cursor, after, items)
        return items, after

    def record(self, account_id: str, salt: bytes, item: dict[str, Any]) -> IngressRecord:
        return message_record(account_id, salt, item)

    async def confirm(self, token: bytes, items: list[dict[str, Any]]) -> None:
        """Nothing to tell Discord: the committed seq is where the next RESUME starts."""

    async def close(self) -> None:
        """Drop every connection (sessions stay resumable for whoever reads next)."""
        for key in list(self.gateways):
            self._drop(key)

    def _drop(self, key: str) -> None:
        gw = self.gateways.pop(key, None)
        if gw is not None:
            gw.ws.transport.abort()  # no close frame: a 1000 would end the session

    # -- connecting ---------------------------------------------------------------------------

    async def _open(self, cred: DiscordCredential, cursor: dict[str, Any]) -> Gateway:
        """A connection that has RESUMEd the cursor's session, or IDENTIFYed a new one."""
        session, seq = cursor.get("session_id"), cursor.get("seq")
        resume_url = cursor.get("resume_url")
        resumable = (isinstance(session, str) and isinstance(resume_url, str)
                     and isinstance(seq, int) and not isinstance(seq, bool))  # fmt: skip
        if resumable:
            try:
                gw = await self._connect(cred, str(resume_url), str(session), str(resume_url), seq)
            except (OSError, GatewayError) as exc:  # resuming on the main gateway works too
                log.info("discord gateway: resume URL failed (%s); using the main URL", exc)
                url = await self._gateway_url(cred)
                gw = await self._connect(cred, url, str(session), str(resume_url), seq)
            await self._send(gw, {"op": 6, "d": {"token": cred.bot_token, "session_id": session,
                                                 "seq": seq}})  # fmt: skip
            return gw
        gw = await self._connect(cred, await self._gateway_url(cred), None, None, None)
        properties = {"os": "linux", "browser": "eventos", "device": "eventos"}
        await self._send(gw, {"op": 2, "d": {"token": cred.bot_token, "intents": cred.intents,
                                             "properties": properties}})  # fmt: skip
        return gw

    async def _gateway_url(self, cred: DiscordCredential) -> str:
        answer = await self.api.call(cred, "GET", "/gateway/bot", self.timeout_s)
        url = answer.get("url")
        if not isinstance(url, str) or not url.startswith(("wss://", "ws://")):
            raise GatewayError("GET /gateway/bot did not answer a websocket URL")
        return url

    async def _connect(self, cred: DiscordCredential, url: str, session: str | None,
                       resume_url: str | None, seq: int | None) -> Gateway:  # fmt: skip
        uri = url.rstrip("/") + "/" + QUERY
        try:
            ws = await connect(uri, open_timeout=self.timeout_s, close_timeout=2,
                               ping_interval=None, max_size=FRAME_MAX, max_queue=QUEUE_MAX,
                               compression=None)  # fmt: skip
        except (InvalidHandshake, InvalidURI) as exc:
            raise GatewayError(f"gateway handshake failed: {exc}") from None
        try:
            async with asyncio.timeout(self.timeout_s):
                hello = _payload(await ws.recv())
        except (TimeoutError, ConnectionClosed):
            ws.transport.abort()
            raise GatewayError("the gateway sent no HELLO") from None
        interval = _obj(hello.get("d")).get("heartbeat_interval")
        if hello.get("op") != 10 or not isinstance(interval, int | float) or interval <= 0:
            ws.transport.abort()
            raise GatewayError("the gateway's first payload was not HELLO")
        interval_s = float(interval) / 1000
        first = time.monotonic() + interval_s * random.random()  # the gateway page's jitter
        return Gateway(ws, session, resume_url, seq, cred.application_id, interval_s, first)

    # -- reading ------------------------------------------------------------------------------

    async def _collect(self, cred: DiscordCredential, gw: Gateway,
                       items: list[dict[str, Any]]) -> bool:  # fmt: skip
        """Messages into `items` until a short linger after one, or `wait_s`; False when the
        connection ended (the session may still resume)."""
        deadline = time.monotonic() + self.wait_s
        while len(items) < PAGE_MAX:
            now = time.monotonic()
            if now >= gw.next_beat:
                if not gw.acked:  # a zombie connection: resume on a fresh one
                    log.info("discord gateway: no heartbeat ACK; reconnecting")
                    return False
                await self._beat(gw)
            until = min(deadline, now + LINGER_S) if items else deadline
            if now >= until:
                return True
            try:
                async with asyncio.timeout(min(until, gw.next_beat) - now):
                    raw = await gw.ws.recv()
            except TimeoutError:
                continue
            except ConnectionClosed as exc:
                return self._closed(gw, exc)
            if not await self._on(cred, gw, _payload(raw), items):
                return False
        return True

    async def _on(self, cred: DiscordCredential, gw: Gateway, payload: dict[str, Any],
                  items: list[dict[str, Any]]) -> bool:  # fmt: skip
        """One gateway payload; False when the connection must end."""
        op, data = payload.get("op"), payload.get("d")
        if op == 0:
            seq = payload.get("s")
            if isinstance(seq, int) and not isinstance(seq, bool):
                gw.seq = seq
            name, d = payload.get("t"), _obj(data)
            if name == "READY":
                gw.session_id = str(d.get("session_id")) if d.get("session_id") else None
                url = d.get("resume_gateway_url")
                gw.resume_url = url if isinstance(url, str) else None
                gw.bot_id = str(_obj(d.get("user")).get("id") or gw.bot_id)
            elif name == "MESSAGE_CREATE" and not self._own(cred, gw, d):
                items.append(d)
        elif op == 1:  # the gateway asks for a heartbeat now
            await self._beat(gw)
        elif op == 11:
            gw.acked = True
        elif op == 7:  # RECONNECT: resume on a new connection
            return False
        elif op == 9:  # INVALID SESSION: d true may resume, false must identify
            if data is not True:
                log.info("discord gateway: session %s invalid; identifying anew", gw.session_id)
                gw.session_id = gw.resume_url = gw.seq = None
                await asyncio.sleep(random.uniform(1.0, 5.0))  # as the gateway page asks
            return False
        return True

    @staticmethod
    def _own(cred: DiscordCredential, gw: Gateway, message: dict[str, Any]) -> bool:
        """The bot's own messages (its replies, its interaction answers) are not inputs."""
        author = _obj(message.get("author")).get("id")
        return author in (gw.bot_id, cred.application_id) or (
            message.get("webhook_id") == cred.application_id)  # fmt: skip

    @staticmethod
    def _closed(gw: Gateway, exc: ConnectionClosed) -> bool:
        code = exc.rcvd.code if exc.rcvd is not None else None
        if code in FATAL_CLOSES:
            raise GatewayError(f"gateway closed {code}: {FATAL_CLOSES[code]}") from None
        if code in NEW_SESSION_CLOSES:
            gw.session_id = gw.resume_url = gw.seq = None
        log.info("discord gateway: connection closed (%s); resuming", code)
        return False

    async def _beat(self, gw: Gateway) -> None:
        await self._send(gw, {"op": 1, "d": gw.seq})
        gw.acked = False
        gw.next_beat = time.monotonic() + gw.interval_s

    @staticmethod
    async def _send(gw: Gateway, payload: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionClosed):  # the next recv reports the close
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                await gw.ws.send(json.dumps(payload))


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _payload(raw: str | bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise GatewayError("the gateway sent a payload that is not JSON") from None
    if not isinstance(doc, dict):
        raise GatewayError("the gateway sent a payload that is not an object")
    return doc
