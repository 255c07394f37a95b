"""A loopback fake of Discord: the REST API (v10) over real HTTP, the gateway over a real
websocket, and Discord's side of HTTP interactions (it POSTs signed interactions to our endpoint).

REST checks `Authorization: Bot <token>`, validates bodies as the API does and answers with its
bodies and headers: message objects, `{"code", "message", "errors"}` errors, per-route and global
rate limits with their 429 body and `X-RateLimit-*` / `Retry-After` headers. Tests queue faults
(an error, a hang, a connection cut mid-answer; optionally after the message was delivered) and
count what was delivered per channel and per interaction. The gateway speaks JSON opcodes 0, 1,
2, 6, 7, 9, 10, 11 with Discord's close codes, and keeps each session's events for RESUME.
The fake's clock (`advance`) drives token expiry, the nonce window, rate windows and session expiry.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import math
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import uvicorn
from nacl.signing import SigningKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from eventos.testing import wait_for

DISCORD_EPOCH_MS = 1_420_070_400_000
APPLICATION_ID = "1187000000000000001"  # the bot user has the application's id
GUILD_ID = "1187000000000000100"
CHANNEL_ID = "1187000000000000200"
USER_ID = "1187000000000000300"
TOKEN = "MTE4NzAwMDAwMDAwMDAwMDAwMQ.GfAk3d.fake-discord-bot-token-0123456789ab"  # id.time.hmac
API = "/api/v10"
CONTENT_MAX = 2000
NONCE_MAX = 25
NONCE_WINDOW_S = 300.0  # "the past few minutes"
ANSWER_WINDOW_S = 3.0  # an interaction unanswered by then failed, and its token is dead
TOKEN_TTL_S = 15 * 60.0
HEARTBEAT_MS = 41_250
PAYLOAD_MAX = 4096  # bytes a client may send in one gateway payload
REPLAY_MAX = 1000  # events a session keeps for RESUME
SESSION_TTL_S = 120.0  # a disconnected session can be resumed this long
HOLD_MAX_S = 120.0  # a hung request is answered by then at the latest
SEND_TIMEOUT_S = 5.0
LOADING, EPHEMERAL = 1 << 7, 1 << 6  # message flags
GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT = 1 << 9, 1 << 12, 1 << 15
INTENTS_MAX = (1 << 26) - 1
FAILED = "This interaction failed"
LIMITS = {"messages": (5, 5.0), "webhooks": (5, 2.0), "gateway": (20, 5.0)}  # per route bucket
GLOBAL_LIMIT = (50, 1.0)  # requests per second per bot; webhooks (interactions) are exempt
CLOSE_REASONS = {
    4000: "Unknown error.", 4001: "Unknown opcode.", 4002: "Error while decoding payload.",
    4003: "Not authenticated.", 4004: "Authentication failed.", 4005: "Already authenticated.",
    4007: "Invalid seq.", 4009: "Session timed out.", 4012: "Invalid API version.",
    4013: "Invalid intent(s).",
}  # fmt: skip
CLIENT_OPS = {1, 2, 3, 4, 6, 8, 31}  # opcodes a client may send


class DiscordError(Exception):
    def __init__(self, status: int, code: int, message: str, errors: Any = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.errors = status, code, message, errors


def form_error(name: str, code: str, message: str) -> DiscordError:
    errors = {name: {"_errors": [{"code": code, "message": message}]}}
    return DiscordError(400, 50035, "Invalid Form Body", errors)


class RateLimited(Exception):
    def __init__(self, retry_after: float, is_global: bool, headers: dict[str, str]) -> None:
        self.retry_after, self.is_global, self.headers = retry_after, is_global, headers


class _Cut(Exception):
    """Raised after a partial answer: uvicorn then closes the connection mid-body."""


class _QuietCut(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _Cut))


logging.getLogger("uvicorn.error").addFilter(_QuietCut())


@dataclass
class Fault:
    """What the next matching REST request gets instead of a normal answer."""

    status: int = 500
    code: int = 0
    message: str = "500: Internal Server Error"
    errors: Any = None
    hang: bool = False  # hold the answer until stop() or release() (HOLD_MAX_S at most)
    cut: bool = False  # close the connection mid-answer
    deliver: bool = False  # do the request's work (the message arrives) before failing
    route: str | None = None  # "messages", "webhooks", "gateway"; None: any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Channel:
    id: str
    guild_id: str | None
    can_send: bool = True
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Interaction:
    id: str
    token: str
    channel_id: str
    guild_id: str | None
    sent_at: float
    answer_type: int | None = None
    valid: bool = True
    original: dict[str, Any] | None = None
    followups: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Reply:
    """What our endpoint answered one interaction; `failed` is what Discord would show."""

    status: int | None  # None: no answer within the 3 s window
    body: Any
    elapsed: float
    failed: str | None
    interaction: Interaction


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


@dataclass
class Bucket:
    limit: int
    per_s: float
    remaining: int = 0
    reset_at: float = 0.0


class CutResponse(Response):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"4096")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"id": "', "more_body": True})
        raise _Cut


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def user(user_id: str, *, bot: bool = False) -> dict[str, Any]:
    name = "eventos-fake" if bot else f"user{user_id[-4:]}"
    return {"id": user_id, "username": name, "global_name": None if bot else name.title(),
            "discriminator": "0", "avatar": None, "public_flags": 0, **({"bot": True} if bot else {})}  # fmt: skip


def check_content(body: dict[str, Any], *, required: bool = True) -> str | None:
    content = body.get("content")
    if content is not None and not isinstance(content, str):
        raise form_error("content", "BASE_TYPE_STRING", "Must be a valid string.")
    if content is not None and len(content) > CONTENT_MAX:
        raise form_error("content", "BASE_TYPE_MAX_LENGTH", f"Must be {CONTENT_MAX} or fewer in length.")  # fmt: skip
    if required and not content and not body.get("embeds") and not body.get("components"):
        raise DiscordError(400, 50006, "Cannot send an empty message")
    return content


def option_type(value: Any) -> int:
    """Application command option types: STRING 3, INTEGER 4, BOOLEAN 5, NUMBER 10."""
    if isinstance(value, bool):
        return 5
    return 4 if isinstance(value, int) else 10 if isinstance(value, float) else 3


class FakeDiscord:
    def __init__(self, token: str = TOKEN, application_id: str = APPLICATION_ID) -> None:
        self.token, self.application_id = token, application_id
        self.signing_key = SigningKey.generate()
        self.bot_user = user(application_id, bot=True)
        self.channels: dict[str, Channel] = {}
        self.interactions: dict[str, Interaction] = {}
        self.sessions: dict[str, Session] = {}
        self.requests: list[Seen] = []
        self.faults: deque[Fault] = deque()
        self.limits = dict(LIMITS)
        self.global_limit = GLOBAL_LIMIT
        self.heartbeat_interval_ms = HEARTBEAT_MS
        self.session_ttl_s = SESSION_TTL_S
        self.gateway_paths: list[str] = []  # the request path of every gateway connection
        self.identifies = self.resumes = 0
        self.port = self.gateway_port = 0
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._nonces: dict[str, tuple[float, dict[str, Any]]] = {}
        self._offset = 0.0
        self._last_snowflake = 0
        self._release = asyncio.Event()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._gateway: Server | None = None
        self.add_channel(CHANNEL_ID, GUILD_ID)

    # -- test-facing API --------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{API}"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.gateway_port}"

    @property
    def resume_gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.gateway_port}/resume"

    @property
    def public_key(self) -> str:
        """The application's Ed25519 public key, hex, as the Developer Portal shows it."""
        return bytes(self.signing_key.verify_key).hex()

    def now(self) -> float:
        return time.monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the fake's clock (token expiry, nonce window, rate windows, session expiry)."""
        self._offset += seconds

    def add_channel(self, channel_id: str, guild_id: str | None = GUILD_ID, *, can_send: bool = True) -> Channel:  # fmt: skip
        """A channel the bot sees; can_send=False answers 403 Missing Access."""
        self.channels[channel_id] = Channel(channel_id, guild_id, can_send)
        return self.channels[channel_id]

    def messages(self, channel_id: str) -> list[dict[str, Any]]:
        """Messages that arrived in a channel (a deferred reply counts once it has content)."""
        channel = self.channels.get(channel_id)
        return [m for m in channel.messages if not m["flags"] & LOADING] if channel else []

    def set_limit(self, route: str, limit: int, per_s: float) -> None:
        """Per-route bucket ("messages", "webhooks", "gateway"), or "global"."""
        if route == "global":
            self.global_limit = (limit, per_s)
        else:
            self.limits[route] = (limit, per_s)
        self._buckets = {k: b for k, b in self._buckets.items() if k[0] != route}

    def reset(self) -> None:
        """Forget messages, interactions, requests, faults, nonces and buckets; default limits."""
        for channel in self.channels.values():
            channel.messages.clear()
        self.interactions.clear()
        self.requests.clear()
        self.faults.clear()
        self._nonces.clear()
        self._buckets.clear()
        self.limits, self.global_limit = dict(LIMITS), GLOBAL_LIMIT

    def fail_next(self, count: int = 1, fault: Fault | None = None) -> None:
        """The next `count` matching REST requests get `fault` (default: a 500)."""
        self.faults.extend([fault or Fault()] * count)

    def release(self) -> None:
        """Answer the hung requests."""
        self._release.set()
        self._release = asyncio.Event()

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        hook = f"{API}/webhooks/{{app_id}}/{{token}}"
        app = Starlette(
            routes=[
                Route(f"{API}/gateway/bot", self._gateway_bot, methods=["GET"]),
                Route(f"{API}/channels/{{channel_id}}/messages", self._create, methods=["POST"]),
                Route(hook, self._followup, methods=["POST"]),
                Route(f"{hook}/messages/{{message_id}}", self._edit, methods=["PATCH"]),
                Route("/{path:path}", self._unknown, methods=["GET", "POST", "PATCH", "DELETE"]),
            ]
        )
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        self._gateway = await serve(
            self._connection, "127.0.0.1", 0, ping_interval=None, compression=None
        )
        self.gateway_port = self._gateway.sockets[0].getsockname()[1]
        server = self._server

        async def started() -> bool:
            return server.started

        await wait_for(started, what="the fake Discord API listens")

    async def stop(self) -> None:
        self._release.set()
        if self._gateway is not None:
            self._gateway.close()
            await asyncio.wait_for(self._gateway.wait_closed(), 10)
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.wait_for(self._task, 10)

    # -- interactions: the fake plays Discord calling our endpoint --------------------------

    async def interact(
        self,
        url: str,
        *,
        type: int = 2,
        name: str = "ask",
        channel_id: str = CHANNEL_ID,
        user_id: str = USER_ID,
        guild_id: str | None = GUILD_ID,
        options: Mapping[str, str | int | float | bool] | None = None,
        tamper: str | None = None,
    ) -> Reply:
        """POST a signed interaction (type 2 command or 1 ping) and judge the answer as Discord."""
        inter = self._new_interaction(channel_id, guild_id)
        body = self._payload(inter, type, name, channel_id, user_id, guild_id, options or {})
        stamp = str(int(time.time()))
        key = SigningKey.generate() if tamper == "key" else self.signing_key
        signature = key.sign(stamp.encode() + body).signature.hex()
        if tamper == "body":
            body = body.replace(b'"version":1', b'"version":2')
        if tamper == "timestamp":
            stamp = str(int(stamp) + 1)
        reply = await self._post(
            url, inter, body, None if tamper == "missing" else stamp, signature
        )
        if tamper is None:
            reply.failed = reply.failed or await self._accept(inter, type, reply)
        inter.valid = tamper is None and reply.failed is None
        return reply

    async def interact_with_bad_signature(
        self, url: str, *, tamper: str = "key", **kwargs: Any
    ) -> Reply:
        """Like `interact`, signed wrongly: tamper = key | body | timestamp | missing (headers)."""
        return await self.interact(url, tamper=tamper, **kwargs)

    def _new_interaction(self, channel_id: str, guild_id: str | None) -> Interaction:
        if channel_id not in self.channels:
            self.add_channel(channel_id, guild_id)
        iid = self._snowflake()
        raw = f"interaction:{iid}:{secrets.token_hex(48)}".encode()
        token = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        self.interactions[token] = Interaction(iid, token, channel_id, guild_id, self.now())
        return self.interactions[token]

    def _payload(
        self, inter: Interaction, kind: int, name: str, channel_id: str, user_id: str,
        guild_id: str | None, options: Mapping[str, Any],
    ) -> bytes:  # fmt: skip
        payload: dict[str, Any] = {
            "id": inter.id, "application_id": self.application_id, "type": kind,
            "token": inter.token, "version": 1, "entitlements": [], "app_permissions": "2248473465835073",
            "authorizing_integration_owners": {"0": guild_id or "0"}, "attachment_size_limit": 10485760,
        }  # fmt: skip
        if kind != 1:
            command_id = str(int(hashlib.sha256(name.encode()).hexdigest()[:15], 16))
            data: dict[str, Any] = {"id": command_id, "name": name, "type": 1}
            if options:
                data["options"] = [{"name": k, "type": option_type(v), "value": v} for k, v in options.items()]  # fmt: skip
            channel = {"id": channel_id, "type": 0 if guild_id else 1, "flags": 0}
            payload |= {"data": data, "channel_id": channel_id, "channel": channel,
                        "locale": "en-US", "context": 0 if guild_id else 1}  # fmt: skip
            if guild_id:
                data["guild_id"] = guild_id
                member: dict[str, Any] = {"user": user(user_id), "roles": [], "permissions": "2248473465835073",
                          "joined_at": iso_now(), "nick": None, "avatar": None, "flags": 0,
                          "pending": False, "deaf": False, "mute": False, "premium_since": None,
                          "communication_disabled_until": None}  # fmt: skip
                payload |= {"guild_id": guild_id, "guild_locale": "en-US", "member": member,
                            "guild": {"id": guild_id, "locale": "en-US", "features": []}}  # fmt: skip
            else:
                payload["user"] = user(user_id)
        return json.dumps(payload, separators=(",", ":")).encode()

    async def _post(
        self, url: str, inter: Interaction, body: bytes, stamp: str | None, signature: str
    ) -> Reply:
        headers = {"content-type": "application/json", "user-agent": "Discord-Interactions/1.0 (+https://discord.com)"}  # fmt: skip
        if stamp is not None:
            headers |= {"x-signature-ed25519": signature, "x-signature-timestamp": stamp}
        began = time.monotonic()
        try:
            async with httpx.AsyncClient() as client, asyncio.timeout(ANSWER_WINDOW_S):
                answer = await client.post(url, content=body, headers=headers)
        except (TimeoutError, httpx.HTTPError):
            inter.valid = False
            return Reply(None, None, time.monotonic() - began, FAILED, inter)
        try:
            parsed: Any = answer.json()
        except ValueError:
            parsed = None
        return Reply(answer.status_code, parsed, time.monotonic() - began, None, inter)

    async def _accept(self, inter: Interaction, kind: int, reply: Reply) -> str | None:
        body = reply.body
        if reply.status != 200 or not isinstance(body, dict):
            return FAILED
        answer, data = body.get("type"), body.get("data") or {}
        if kind == 1:
            return None if answer == 1 else FAILED
        if answer not in (4, 5) or not isinstance(data, dict):
            return FAILED
        try:
            content = check_content(data, required=answer == 4) or ""
        except DiscordError:
            return FAILED
        flags = data.get("flags") or 0
        if not isinstance(flags, int):
            return FAILED
        flags = flags & EPHEMERAL | (LOADING if answer == 5 else 0)
        channel = self.channels[inter.channel_id]
        inter.answer_type = answer
        inter.original = self._message(channel, content, flags=flags, type=20)
        await self._broadcast(channel, inter.original)
        return None

    # -- REST --------------------------------------------------------------------------------

    async def _unknown(self, request: Request) -> Response:
        return JSONResponse({"message": "404: Not Found", "code": 0}, 404)

    async def _gateway_bot(self, request: Request) -> Response:
        async def act(body: Any) -> dict[str, Any]:
            limit = {"total": 1000, "remaining": 1000 - self.identifies,
                     "reset_after": 86_400_000, "max_concurrency": 1}  # fmt: skip
            return {"url": self.gateway_url, "shards": 1, "session_start_limit": limit}

        return await self._handle(request, "gateway", "-", act)

    async def _create(self, request: Request) -> Response:
        channel_id = request.path_params["channel_id"]

        async def act(body: Any) -> dict[str, Any]:
            channel = self.channels.get(channel_id)
            if channel is None:
                raise DiscordError(404, 10003, "Unknown Channel")
            if not channel.can_send:
                raise DiscordError(403, 50001, "Missing Access")
            content = check_content(body) or ""
            nonce = body.get("nonce")
            if isinstance(nonce, bool) or not isinstance(nonce, (int, str, type(None))):
                raise form_error("nonce", "NONCE_TYPE_INVALID", "Nonce must be an integer or string.")  # fmt: skip
            if isinstance(nonce, str) and len(nonce) > NONCE_MAX:
                raise form_error("nonce", "BASE_TYPE_MAX_LENGTH", f"Must be {NONCE_MAX} or fewer in length.")  # fmt: skip
            enforce = nonce is not None and body.get("enforce_nonce") is True
            now = self.now()
            self._nonces = {k: v for k, v in self._nonces.items() if now - v[0] < NONCE_WINDOW_S}
            if enforce and str(nonce) in self._nonces:  # same author (the bot), same nonce
                return self._nonces[str(nonce)][1]
            message = self._message(channel, content, nonce=nonce, embeds=body.get("embeds"))
            await self._broadcast(channel, message)
            if enforce:
                self._nonces[str(nonce)] = (now, message)
            return message

        return await self._handle(request, "messages", channel_id, act)

    async def _followup(self, request: Request) -> Response:
        app_id, token = request.path_params["app_id"], request.path_params["token"]

        async def act(body: Any) -> dict[str, Any]:
            inter = self._live(app_id, token)
            content = check_content(body) or ""
            original = inter.original
            if original is not None and original["flags"] & LOADING:
                original.update(content=content, flags=original["flags"] & ~LOADING)
                return original  # after a defer, the first follow-up fills the loading message
            message = self._message(self.channels[inter.channel_id], content, webhook=True)
            inter.followups.append(message)
            await self._broadcast(self.channels[inter.channel_id], message)
            return message

        return await self._handle(request, "webhooks", f"{app_id}/{token}", act, bot=False)

    async def _edit(self, request: Request) -> Response:
        app_id, token = request.path_params["app_id"], request.path_params["token"]
        message_id = request.path_params["message_id"]

        async def act(body: Any) -> dict[str, Any]:
            inter = self._live(app_id, token)
            found = [inter.original] if message_id == "@original" else [
                m for m in inter.followups if m["id"] == message_id]  # fmt: skip
            if not found or found[0] is None:
                raise DiscordError(404, 10008, "Unknown Message")
            message, content = found[0], check_content(body, required=False)
            if content is not None:
                loading = message["flags"] & LOADING
                message.update(content=content, flags=message["flags"] & ~LOADING)
                message["edited_timestamp"] = None if loading else iso_now()
            return message

        return await self._handle(request, "webhooks", f"{app_id}/{token}", act, bot=False)

    def _live(self, app_id: str, token: str) -> Interaction:
        inter = self.interactions.get(token)
        live = (
            inter and inter.valid and inter.answer_type in (4, 5) and app_id == self.application_id
        )
        if inter is None or not live or self.now() - inter.sent_at > TOKEN_TTL_S:
            raise DiscordError(404, 10015, "Unknown Webhook")
        return inter

    async def _handle(
        self,
        request: Request,
        route: str,
        resource: str,
        act: Callable[[Any], Awaitable[dict[str, Any]]],
        *,
        bot: bool = True,
    ) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        self.requests.append(Seen(request.method, request.url.path, dict(request.headers), body))
        headers: dict[str, str] = {}
        try:
            if bot and request.headers.get("authorization") != f"Bot {self.token}":
                raise DiscordError(401, 0, "401: Unauthorized")
            headers = self._take(route, resource, bot=bot)
            if not isinstance(body, dict):
                raise DiscordError(400, 50109, "The request body contains invalid JSON.")
            fault = next((f for f in self.faults if f.route in (None, route)), None)
            if fault is None:
                return JSONResponse(await act(body), headers=headers)
            self.faults.remove(fault)
            result = await act(body) if fault.deliver else None
            if fault.hang:
                release = self._release
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(release.wait(), HOLD_MAX_S)
            if fault.cut:
                return CutResponse()
            if fault.status < 400:
                return JSONResponse(result if result is not None else await act(body), headers=headers)  # fmt: skip
            raise DiscordError(fault.status, fault.code, fault.message, fault.errors)
        except RateLimited as limited:
            answer = {"message": "You are being rate limited.", "retry_after": round(limited.retry_after, 3), "global": limited.is_global}  # fmt: skip
            return JSONResponse(answer, 429, headers=limited.headers)
        except DiscordError as exc:
            error: dict[str, Any] = {"message": exc.message, "code": exc.code}
            if exc.errors is not None:
                error["errors"] = exc.errors
            return JSONResponse(error, exc.status, headers=headers)

    def _take(self, route: str, resource: str, *, bot: bool) -> dict[str, str]:
        """Spend one request from the global (bots, not webhooks) and the route's bucket."""
        now = self.now()
        if bot:
            glob = self._bucket(("global", "-"), *self.global_limit)
            if not self._spend(glob, now):
                after = glob.reset_at - now
                headers = {"Retry-After": str(math.ceil(after)), "X-RateLimit-Global": "true", "X-RateLimit-Scope": "global"}  # fmt: skip
                raise RateLimited(after, True, headers)
        bucket = self._bucket((route, resource), *self.limits[route])
        spent = self._spend(bucket, now)
        after = bucket.reset_at - now
        headers = {
            "X-RateLimit-Limit": str(bucket.limit),
            "X-RateLimit-Remaining": str(bucket.remaining),
            "X-RateLimit-Reset": f"{time.time() + self._offset + after:.3f}",
            "X-RateLimit-Reset-After": f"{after:.3f}",
            "X-RateLimit-Bucket": hashlib.sha256(route.encode()).hexdigest()[:32],
        }
        if not spent:
            headers |= {"Retry-After": str(math.ceil(after)), "X-RateLimit-Scope": "user"}
            raise RateLimited(after, False, headers)
        return headers

    def _bucket(self, key: tuple[str, str], limit: int, per_s: float) -> Bucket:
        return self._buckets.setdefault(key, Bucket(limit, per_s))

    @staticmethod
    def _spend(bucket: Bucket, now: float) -> bool:
        if now >= bucket.reset_at:
            bucket.remaining, bucket.reset_at = bucket.limit, now + bucket.per_s
        if bucket.remaining == 0:
            return False
        bucket.remaining -= 1
        return True

    def _snowflake(self) -> str:
        value = max((int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22, self._last_snowflake + 1)
        self._last_snowflake = value
        return str(value)

    def _message(
        self, channel: Channel, content: str, *, author: dict[str, Any] | None = None,
        nonce: Any = None, embeds: Any = None, flags: int = 0, type: int = 0, webhook: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """A message object, recorded in its channel."""
        message: dict[str, Any] = {
            "id": self._snowflake(), "type": type, "channel_id": channel.id,
            "author": author or self.bot_user, "content": content, "timestamp": iso_now(),
            "edited_timestamp": None, "tts": False, "mention_everyone": False, "mentions": [],
            "mention_roles": [], "attachments": [], "embeds": embeds or [], "pinned": False,
            "flags": flags, "components": [],
        }  # fmt: skip
        if nonce is not None:
            message["nonce"] = nonce
        if webhook or type == 20:
            message |= {"webhook_id": self.application_id, "application_id": self.application_id}
        channel.messages.append(message)
        return message

    # -- gateway -----------------------------------------------------------------------------

    async def post_channel_message(
        self, channel_id: str, author_id: str, content: str
    ) -> dict[str, Any]:
        """A user posts in a channel: recorded, and MESSAGE_CREATE to every live session."""
        channel = self.channels.get(channel_id) or self.add_channel(channel_id)
        message = self._message(channel, content, author=user(author_id))
        await self._broadcast(channel, message)
        return message

    async def drop_connection(self, code: int | None = 4000) -> None:
        """Close every gateway connection (a resumable code; None: cut TCP); sessions stay."""
        for session in self.sessions.values():
            async with session.lock:
                conn, session.conn, session.disconnected_at = session.conn, None, self.now()
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
        return [s for s in self.sessions.values() if s.conn is not None]

    async def _broadcast(self, channel: Channel, message: dict[str, Any]) -> None:
        needed = GUILD_MESSAGES if channel.guild_id else DIRECT_MESSAGES
        for session in list(self.sessions.values()):
            if not session.valid or not session.intents & needed:
                continue
            event = dict(message)
            if channel.guild_id:
                event["guild_id"] = channel.guild_id
            mine = message["author"]["id"] == self.application_id
            if channel.guild_id and not mine and not session.intents & MESSAGE_CONTENT:
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
            session.conn, session.disconnected_at = None, self.now()

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
        self.gateway_paths.append(path)
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
                session.conn, session.disconnected_at = None, self.now()
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
        ready = {"v": 10, "user": self.bot_user, "guilds": [{"id": GUILD_ID, "unavailable": True}],
                 "session_id": session.id, "resume_gateway_url": self.resume_gateway_url,
                 "shard": [0, 1], "application": {"id": self.application_id, "flags": 0}}  # fmt: skip
        async with session.lock:
            await self._dispatch(session, "READY", ready, keep=False)
        return session

    async def _resume(
        self, ws: ServerConnection, data: dict[str, Any]
    ) -> tuple[int | None, Session | None]:
        session, seq = self.sessions.get(str(data.get("session_id"))), data.get("seq")
        gone = session is not None and session.disconnected_at is not None and (
            self.now() - session.disconnected_at > self.session_ttl_s)  # fmt: skip
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
                    session.conn, session.disconnected_at = None, self.now()
                    return None, session
            await self._dispatch(session, "RESUMED", {}, keep=False)
        self.resumes += 1
        return None, session
