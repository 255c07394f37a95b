"""A loopback fake of the Telegram Bot API, served over real HTTP on 127.0.0.1.

`{base_url}/bot{token}/{method}` takes GET query, POST JSON, form or multipart, as the API does
(method names are case-insensitive). Several bots, each with its own update queue and the API's
offset rules: a getUpdates with offset N confirms every update below N, a negative offset keeps
the last -N; long polls wake on a new update; a newer getUpdates ends the waiting one with 409;
updates older than 24 h are dropped; no getUpdates while a webhook is set. sendMessage checks
the text (1-4096 characters after entity parsing), the chat, the reply target and the rate
limits, and records each message sent. Answers are `{"ok": true, "result": ...}` or the API's
error object. Tests enqueue customer messages, hold or drop getUpdates calls, and make the next
calls fail, hang or break off. Hooks are synchronous and must be called on the server's loop.
"""

from __future__ import annotations

import asyncio
import html
import itertools
import json
import math
import random
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from fake_server import (
    HOLD_MAX_S,
    Broken,
    Fault,
    Json,
    LoopbackFake,
    Windows,
    read_params,
    wait_event,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

MAX_TEXT = 4096
MAX_PENDING = 100_000  # updates kept per bot (the API keeps them 24 h)
KEEP_S = 24 * 3600.0
MAX_POLL_S = 50  # the API's longest long poll
PARSE_MODES = {"HTML", "Markdown", "MarkdownV2"}
CONFLICT = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first"
)
ChatType = Literal["private", "group", "supergroup"]
DEFAULT_UPDATES = ["message", "edited_message", "channel_post", "callback_query"]


class BotApiError(Exception):
    def __init__(self, code: int, description: str, parameters: Json | None = None) -> None:
        super().__init__(description)
        self.code, self.description, self.parameters = code, description, parameters


@dataclass
class Limits:
    """Sliding windows (messages, seconds); None switches one off. Defaults: the API's FAQ."""

    private: tuple[int, float] | None = (1, 1.0)
    group: tuple[int, float] | None = (20, 60.0)
    bot: tuple[int, float] | None = (30, 1.0)


@dataclass
class Held:
    """A getUpdates call parked before it is processed."""

    params: Json
    done: asyncio.Event = field(default_factory=asyncio.Event)
    drop: bool = False


@dataclass
class Bot:
    token: str
    user: Json
    next_update: int
    updates: deque[Json] = field(default_factory=deque)
    confirmed: int = 0
    webhook: str = ""
    allowed: list[str] = field(default_factory=lambda: list(DEFAULT_UPDATES))
    poller: object | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    chats: dict[int, Json] = field(default_factory=dict)
    message_ids: dict[int, int] = field(default_factory=dict)
    messages: set[tuple[int, int]] = field(default_factory=set)
    blocked: set[int] = field(default_factory=set)
    migrated: dict[int, int] = field(default_factory=dict)
    sent: list[Json] = field(default_factory=list)
    windows: Windows = field(default_factory=Windows)
    holding: bool = False
    held: list[Held] = field(default_factory=list)
    calls: list[tuple[str, Json]] = field(default_factory=list)

    def wake(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()


class FakeTelegram(LoopbackFake):
    what = "the fake Telegram Bot API"

    def __init__(self) -> None:
        super().__init__()
        self.bots: dict[str, Bot] = {}
        self.limits = Limits()
        self.closing = False  # long polls answer now
        # sendMessage takes effect at once and answers after a pause drawn from this range:
        # a slow API, so a sender that dies meanwhile cannot know its message went out.
        self.send_latency_s = (0.0, 0.0)

    # -- accounts and customers -------------------------------------------------------------

    def add_bot(self, username: str = "eventos_test_bot") -> str:
        """A new bot; returns its token (`<bot id>:<secret>`)."""
        bot_id = random.randint(6_000_000_000, 7_999_999_999)
        token = f"{bot_id}:AA{random.randbytes(16).hex()}"
        user = {"id": bot_id, "is_bot": True, "first_name": username.split("_")[0].title(),
                "username": username}  # fmt: skip
        self.bots[token] = Bot(token, user, next_update=random.randint(10**8, 9 * 10**8))
        return token

    def revoke(self, token: str) -> str:
        """BotFather's /revoke: the bot gets a new token (returned) and the old one answers 401
        from now on; its chats, updates and offsets stay."""
        bot = self.bots.pop(token)
        bot.token = f"{bot.user['id']}:AA{random.randbytes(16).hex()}"
        self.bots[bot.token] = bot
        return bot.token

    def add_chat(
        self, token: str, chat_id: int, *, chat_type: ChatType = "private",
        title: str = "Customers", first_name: str = "Ada", username: str | None = None,
    ) -> Json:  # fmt: skip
        """Make a chat known to the bot (a customer wrote, or the bot was added to a group)."""
        bot = self.bots[token]
        if chat_type == "private":
            chat: Json = {"id": chat_id, "first_name": first_name, "type": "private"}
            if username:
                chat["username"] = username
        else:
            chat = {"id": chat_id, "title": title, "type": chat_type}
        return bot.chats.setdefault(chat_id, chat)

    def customer_message(
        self, token: str, chat_id: int, text: str, *, chat_type: ChatType = "private",
        from_id: int | None = None, first_name: str = "Ada", last_name: str | None = None,
        username: str | None = None, title: str = "Customers", reply_to: int | None = None,
    ) -> Json:  # fmt: skip
        """Enqueue a `message` update as the API would deliver it; returns the update."""
        bot = self.bots[token]
        user_id = from_id or (chat_id if chat_type == "private" else 5_550_000_001)
        sender: Json = {"id": user_id, "is_bot": False, "first_name": first_name}
        sender |= {k: v for k, v in (("last_name", last_name), ("username", username)) if v}
        sender["language_code"] = "en"
        chat = self.add_chat(token, chat_id, chat_type=chat_type, title=title,
                             first_name=first_name, username=username)  # fmt: skip
        message = self._message(bot, chat, sender, text)
        if reply_to is not None:
            message["reply_to_message"] = {"message_id": reply_to, "chat": chat, "date": 0}
        update = {"update_id": bot.next_update, "message": message}
        bot.next_update += 1
        if "message" in bot.allowed and len(bot.updates) < MAX_PENDING:
            bot.updates.append(update)
            bot.wake()
        return update

    def block(self, token: str, chat_id: int) -> None:
        """The user blocked the bot: sends answer 403."""
        self.bots[token].blocked.add(chat_id)

    def migrate(self, token: str, chat_id: int, new_chat_id: int) -> None:
        """The group became a supergroup: sends answer 400 with migrate_to_chat_id."""
        bot = self.bots[token]
        bot.migrated[chat_id] = new_chat_id
        bot.chats[new_chat_id] = {**bot.chats.pop(chat_id), "id": new_chat_id, "type": "supergroup"}

    # -- what the tests read ---------------------------------------------------------------

    def pending(self, token: str) -> list[Json]:
        """Updates not confirmed yet (and not older than 24 h)."""
        self._expire(self.bots[token])
        return list(self.bots[token].updates)

    def confirmed_offset(self, token: str) -> int:
        """Every update below this id is confirmed (0: none yet)."""
        return self.bots[token].confirmed

    def sent(self, token: str, chat_id: int | None = None) -> list[Json]:
        """Messages the bot sent (to one chat), in order."""
        return [m for m in self.bots[token].sent if chat_id in (None, m["chat"]["id"])]

    def calls(self, token: str, method: str | None = None) -> list[Json]:
        """Parameters of every call received (of one method, case-insensitive)."""
        wanted = method.lower() if method else None
        return [p for m, p in self.bots[token].calls if wanted in (None, m)]

    # -- faults and holds -----------------------------------------------------------------

    def fail_next(self, token: str, k: int, code: int, description: str = "",
                  parameters: Json | None = None, method: str = "sendMessage",
                  raw: bytes | None = None) -> None:  # fmt: skip
        """The next k calls answer this error, or `raw` as an HTML page (and have no effect)."""
        body = _error_body(BotApiError(code, description, parameters))
        faults = [Fault("error", code, body, raw) for _ in range(k)]
        self.inject((token, method.lower()), *faults)

    def hang_next(self, token: str, k: int = 1, method: str = "sendMessage", *,
                  applied: bool = True) -> None:  # fmt: skip
        """The next k calls never answer (the connection closes at `release` or stop)."""
        self.inject((token, method.lower()), *[Fault("hang", applied=applied) for _ in range(k)])

    def cut_next(self, token: str, k: int = 1, method: str = "sendMessage", *,
                 applied: bool = True) -> None:  # fmt: skip
        """The next k calls break off mid-answer: the client cannot know the outcome."""
        self.inject((token, method.lower()), *[Fault("cut", applied=applied) for _ in range(k)])

    def hold(self, token: str) -> None:
        """Park getUpdates calls as they arrive, before they confirm anything."""
        self.bots[token].holding = True

    def held(self, token: str) -> list[Json]:
        """Parameters of the parked getUpdates calls."""
        return [h.params for h in self.bots[token].held]

    def release(self, token: str, *, drop: bool = False) -> None:
        """Stop holding; parked calls proceed, or with drop=True vanish with no effect."""
        bot = self.bots[token]
        bot.holding = False
        for parked in bot.held:
            parked.drop = drop
            parked.done.set()
        bot.held.clear()

    def routes(self) -> list[Route]:
        return [
            Route("/bot{token}/{method}", self._call, methods=["GET", "POST"]),
            Route("/{path:path}", self._not_found, methods=["GET", "POST"]),
        ]

    async def stop(self) -> None:
        self.closing = True
        for bot in self.bots.values():
            self.release(bot.token, drop=True)
            bot.wake()
        await super().stop()

    async def _not_found(self, request: Request) -> Response:
        return _error(BotApiError(404, "Not Found"))

    async def _call(self, request: Request) -> Response:
        bot = self.bots.get(request.path_params["token"])
        if bot is None:
            return _error(BotApiError(401, "Unauthorized"))
        method = request.path_params["method"].lower()
        handler = self._methods().get(method)
        if handler is None:
            return _error(BotApiError(404, "Not Found"))
        try:
            params = await read_params(request)
        except ValueError:
            return _error(BotApiError(400, "Bad Request: can't parse JSON object"))
        bot.calls.append((method, params))
        if method == "getupdates" and bot.holding:
            parked = Held(params)
            bot.held.append(parked)
            await asyncio.wait_for(parked.done.wait(), HOLD_MAX_S)
            if parked.drop:
                return Broken(b"")

        async def run() -> Response:
            try:
                result = await handler(bot, params)
            except BotApiError as exc:
                return _error(exc)
            return JSONResponse({"ok": True, "result": result})

        return await self.answer((bot.token, method), run)

    def _methods(self) -> dict[str, Any]:
        return {
            "getme": self._get_me,
            "getupdates": self._get_updates,
            "setwebhook": self._set_webhook,
            "deletewebhook": self._delete_webhook,
            "getwebhookinfo": self._get_webhook_info,
            "sendmessage": self._send_message,
        }

    async def _get_me(self, bot: Bot, params: Json) -> Json:
        return {**bot.user, "can_join_groups": True, "can_read_all_group_messages": False,
                "supports_inline_queries": False}  # fmt: skip

    async def _set_webhook(self, bot: Bot, params: Json) -> bool:
        url = str(params.get("url") or "")
        if url and not url.startswith("https://"):
            raise BotApiError(
                400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook"
            )
        bot.webhook = url
        return True

    async def _delete_webhook(self, bot: Bot, params: Json) -> bool:
        bot.webhook = ""
        if _bool(params, "drop_pending_updates"):
            self._confirm(bot, bot.next_update)
        return True

    async def _get_webhook_info(self, bot: Bot, params: Json) -> Json:
        return {"url": bot.webhook, "has_custom_certificate": False,
                "pending_update_count": len(bot.updates)}  # fmt: skip

    async def _get_updates(self, bot: Bot, params: Json) -> list[Json]:
        if bot.webhook:
            raise BotApiError(409, WEBHOOK_CONFLICT)
        offset, limit = _int(params, "offset", 0), _int(params, "limit", 100)
        timeout = min(max(_int(params, "timeout", 0), 0), MAX_POLL_S)
        limit = limit if 1 <= limit <= 100 else 100  # the API clamps
        if "allowed_updates" in params:
            allowed = _obj(params, "allowed_updates")
            bot.allowed = (
                list(allowed) if isinstance(allowed, list) and allowed else list(DEFAULT_UPDATES)
            )
        me = object()
        if bot.poller is not None:
            bot.wake()  # the waiting call sees it was replaced
        bot.poller = me
        if offset < 0:
            keep = list(bot.updates)[offset:]
            self._confirm(bot, keep[0]["update_id"] if keep else bot.next_update)
        elif offset > 0:
            self._confirm(bot, offset)
        deadline = time.monotonic() + timeout
        while True:
            self._expire(bot)
            if bot.poller is not me:
                raise BotApiError(409, CONFLICT)
            left = deadline - time.monotonic()
            if bot.updates or left <= 0 or self.closing:
                bot.poller = None
                return list(itertools.islice(bot.updates, limit))
            await wait_event(bot.changed, left)

    def _confirm(self, bot: Bot, below: int) -> None:
        while bot.updates and bot.updates[0]["update_id"] < below:
            bot.confirmed = bot.updates.popleft()["update_id"] + 1

    def _expire(self, bot: Bot) -> None:
        while bot.updates and bot.updates[0]["message"]["date"] < self.now() - KEEP_S:
            bot.updates.popleft()

    async def _send_message(self, bot: Bot, params: Json) -> Json:
        chat_id = _chat_id(params)
        chat = self._chat(bot, chat_id)
        text = _text(params)
        reply = _obj(params, "reply_parameters") or {}
        if not isinstance(reply, dict):
            raise BotApiError(400, "Bad Request: can't parse reply parameters JSON object")
        reply_id = reply.get("message_id", params.get("reply_to_message_id"))
        if reply_id is not None and (chat_id, int(reply_id)) not in bot.messages:
            if not reply.get("allow_sending_without_reply"):
                raise BotApiError(400, "Bad Request: message to be replied not found")
            reply_id = None
        self._take(bot, chat)
        message = self._message(bot, chat, bot.user, text)
        if reply_id is not None:
            message["reply_to_message"] = {"message_id": int(reply_id), "chat": chat, "date": 0}
        bot.sent.append(message)
        if self.send_latency_s[1] > 0:
            await asyncio.sleep(random.uniform(*self.send_latency_s))
        return message

    def _chat(self, bot: Bot, chat_id: int) -> Json:
        if chat_id in bot.migrated:
            raise BotApiError(400, "Bad Request: group chat was upgraded to a supergroup chat",
                              {"migrate_to_chat_id": bot.migrated[chat_id]})  # fmt: skip
        if chat_id not in bot.chats:
            raise BotApiError(400, "Bad Request: chat not found")
        if chat_id in bot.blocked:
            raise BotApiError(403, "Forbidden: bot was blocked by the user")
        return bot.chats[chat_id]

    def _take(self, bot: Bot, chat: Json) -> None:
        """Count one send in each window, or answer 429 with the wait the fullest one needs."""
        per_chat = self.limits.private if chat["type"] == "private" else self.limits.group
        now = self.now()
        wait = max(bot.windows.wait(chat["id"], per_chat, now),
                   bot.windows.wait("bot", self.limits.bot, now))  # fmt: skip
        if wait > 0:
            after = max(1, math.ceil(wait))
            raise BotApiError(
                429, f"Too Many Requests: retry after {after}", {"retry_after": after}
            )
        bot.windows.take([chat["id"], "bot"], now)

    def _message(self, bot: Bot, chat: Json, sender: Json, text: str) -> Json:
        message_id = bot.message_ids.get(chat["id"], 0) + 1
        bot.message_ids[chat["id"]] = message_id
        bot.messages.add((chat["id"], message_id))
        return {"message_id": message_id, "from": sender, "chat": chat,
                "date": int(self.now()), "text": text}  # fmt: skip


def _error_body(exc: BotApiError) -> Json:
    body: Json = {"ok": False, "error_code": exc.code, "description": exc.description}
    return body | ({"parameters": exc.parameters} if exc.parameters else {})


def _error(exc: BotApiError) -> Response:
    return JSONResponse(_error_body(exc), exc.code)


def _int(params: Json, name: str, default: int) -> int:
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BotApiError(400, f'Bad Request: field "{name}" must be of type Integer') from None


def _bool(params: Json, name: str) -> bool:
    value = params.get(name)
    return value is True or str(value).lower() in ("true", "1")


def _obj(params: Json, name: str) -> Any:
    """An object or array parameter: as is from JSON, JSON-serialized from a query or form."""
    value = params.get(name)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise BotApiError(400, f"Bad Request: can't parse {name} JSON object") from None
    return value


def _chat_id(params: Json) -> int:
    value = params.get("chat_id")
    if value is None or value == "":
        raise BotApiError(400, "Bad Request: chat_id is empty")
    if isinstance(value, str) and value.startswith("@"):
        raise BotApiError(400, "Bad Request: chat not found")
    return _int(params, "chat_id", 0)


def _text(params: Json) -> str:
    text, mode = params.get("text"), params.get("parse_mode")
    if not isinstance(text, str) or not text.strip():
        raise BotApiError(400, "Bad Request: message text is empty")
    if mode not in (None, "", *PARSE_MODES):
        raise BotApiError(400, f"Bad Request: unsupported parse_mode {mode!r}")
    shown = _plain(text, str(mode or "")).strip()
    if not shown:
        raise BotApiError(400, "Bad Request: message text is empty")
    if len(shown) > MAX_TEXT:
        raise BotApiError(400, "Bad Request: message is too long")
    return shown


def _plain(text: str, mode: str) -> str:
    """The text a reader sees once the parse mode's markup is taken out."""
    if mode == "HTML":
        return html.unescape(re.sub(r"<[^>]*>", "", text))
    if mode.startswith("Markdown"):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        return re.sub(r"\\(.)|[*_~|`]", lambda m: m.group(1) or "", text)
    return text
