"""A loopback fake of Discord: the REST API (v10) over real HTTP, the gateway over a real
websocket, and Discord's side of HTTP interactions (it POSTs signed interactions to our endpoint).

REST checks `Authorization: Bot <token>`, validates bodies as the API does and answers with its
bodies and headers: message objects, `{"code", "message", "errors"}` errors, per-route and global
rate limits with their 429 body and `X-RateLimit-*` / `Retry-After` headers. Tests queue faults
(an error, a hang, a connection cut mid-answer; optionally after the message was delivered) and
count what was delivered per channel and per interaction. Messages created here reach the
gateway (fake_discord_gateway.py) as MESSAGE_CREATE, the bot's own included, as on Discord.
The fake's clock (`advance`) drives token expiry, the nonce window, rate windows and session expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fake_discord_gateway import FakeGateway
from fake_discord_interactions import (
    CONTENT_MAX,
    LOADING,
    Interaction,
    InteractionCaller,
    Reply,
    iso_now,
    user,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from eventos.testing import wait_for

DISCORD_EPOCH_MS = 1_420_070_400_000
APPLICATION_ID = "1187000000000000001"  # the bot user has the application's id
GUILD_ID = "1187000000000000100"
CHANNEL_ID = "1187000000000000200"
USER_ID = "1187000000000000300"
TOKEN = "MTE4NzAwMDAwMDAwMDAwMDAwMQ.GfAk3d.fake-discord-bot-token-0123456789ab"  # id.time.hmac
API = "/api/v10"
NONCE_MAX = 25
NONCE_WINDOW_S = 300.0  # "the past few minutes"
HOLD_MAX_S = 120.0  # a hung request is answered by then at the latest
LIMITS = {"messages": (5, 5.0), "webhooks": (5, 2.0), "gateway": (20, 5.0)}  # per route bucket
GLOBAL_LIMIT = (50, 1.0)  # requests per second per bot; webhooks (interactions) are exempt


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


def check_content(body: dict[str, Any], *, required: bool = True) -> str | None:
    content = body.get("content")
    if content is not None and not isinstance(content, str):
        raise form_error("content", "BASE_TYPE_STRING", "Must be a valid string.")
    if content is not None and len(content) > CONTENT_MAX:
        raise form_error("content", "BASE_TYPE_MAX_LENGTH", f"Must be {CONTENT_MAX} or fewer in length.")  # fmt: skip
    if required and not content and not body.get("embeds") and not body.get("components"):
        raise DiscordError(400, 50006, "Cannot send an empty message")
    return content


class FakeDiscord:
    def __init__(self, token: str = TOKEN, application_id: str = APPLICATION_ID) -> None:
        self.token, self.application_id = token, application_id
        self.bot_user = user(application_id, bot=True)
        self.channels: dict[str, Channel] = {}
        self.caller = InteractionCaller(application_id, self.now, self._snowflake, self._answered)
        self.requests: list[Seen] = []
        self.faults: deque[Fault] = deque()
        self.limits = dict(LIMITS)
        self.global_limit = GLOBAL_LIMIT
        self.gateway = FakeGateway(token, self.bot_user, [GUILD_ID], self.now)
        self.port = 0
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._nonces: dict[str, tuple[float, dict[str, Any]]] = {}
        self._offset = 0.0
        self._last_snowflake = 0
        self._release = asyncio.Event()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.add_channel(CHANNEL_ID, GUILD_ID)

    # -- test-facing API --------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{API}"

    @property
    def public_key(self) -> str:
        """The application's Ed25519 public key, hex, for our endpoint's settings."""
        return self.caller.public_key

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
        self.caller.records.clear()
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
        await self.gateway.start()
        server = self._server

        async def started() -> bool:
            return server.started

        await wait_for(started, what="the fake Discord API listens")

    async def stop(self) -> None:
        self._release.set()
        await self.gateway.stop()
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
        """POST a signed interaction (type 2 command, 1 ping) to our endpoint; judge the answer."""
        return await self.caller.interact(
            url, type=type, name=name, channel_id=channel_id, user_id=user_id,
            guild_id=guild_id, options=options, tamper=tamper,
        )  # fmt: skip

    async def interact_with_bad_signature(self, url: str, *, tamper: str = "key", **fields: Any) -> Reply:  # fmt: skip
        """Like `interact`, signed wrongly: tamper = key | body | timestamp | missing (headers)."""
        return await self.interact(url, tamper=tamper, **fields)

    async def _answered(self, inter: Interaction, content: str, flags: int) -> dict[str, Any]:
        channel = self.channels.get(inter.channel_id) or self.add_channel(inter.channel_id, inter.guild_id)  # fmt: skip
        message = self._message(channel, content, flags=flags, type=20)
        await self.gateway.broadcast(channel.guild_id, message)
        return message

    # -- REST --------------------------------------------------------------------------------

    async def _unknown(self, request: Request) -> Response:
        return JSONResponse({"message": "404: Not Found", "code": 0}, 404)

    async def _gateway_bot(self, request: Request) -> Response:
        async def act(body: Any) -> dict[str, Any]:
            limit = {"total": 1000, "remaining": 1000 - self.gateway.identifies,
                     "reset_after": 86_400_000, "max_concurrency": 1}  # fmt: skip
            return {"url": self.gateway.url, "shards": 1, "session_start_limit": limit}

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
            await self.gateway.broadcast(channel.guild_id, message)
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
            channel = self.channels[inter.channel_id]
            message = self._message(channel, content, webhook=True)
            inter.followups.append(message)
            await self.gateway.broadcast(channel.guild_id, message)
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
        inter = self.caller.live(app_id, token)
        if inter is None:
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

    # -- gateway ---------------------------------------------------------------------------

    async def post_channel_message(
        self, channel_id: str, author_id: str, content: str
    ) -> dict[str, Any]:
        """A user posts in a channel: recorded, and MESSAGE_CREATE to every live session."""
        channel = self.channels.get(channel_id) or self.add_channel(channel_id)
        message = self._message(channel, content, author=user(author_id))
        await self.gateway.broadcast(channel.guild_id, message)
        return message

    async def drop_connection(self, code: int | None = 4000) -> None:
        """Close every gateway connection (a resumable code; None: cut TCP); sessions stay."""
        await self.gateway.drop_connection(code)
