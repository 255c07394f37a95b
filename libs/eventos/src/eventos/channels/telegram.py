"""Telegram (Bot API, SPEC §6.4): a `getUpdates` long-poll reader and a `sendMessage` sender.

Reader: Telegram holds unconfirmed updates for 24 h; a `getUpdates` call with `offset` N
confirms every update below N. The reader asks from the account's cursor, appends the page and
moves the cursor in ONE transaction fenced by its lease, and only its next call (from that
cursor) confirms the page to Telegram. A reader killed before the commit reads the page again;
one killed after it confirms the page with its next call; an update read twice (a page whose
confirming call never came) is a duplicate of its `update_id`. So nothing is lost or doubled.

Sender: `sendMessage` has no idempotency key, so a send is at most once: a call that may have
reached Telegram and did not answer clearly is `unknown` (SPEC §11). A 429's `retry_after` is
honoured for the whole bot.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import httpx

from eventos import names
from eventos.bus.envelope import encoded_size, new_event_id
from eventos.bus.inbox import IngressRecord
from eventos.channels.http import CONNECT_TIMEOUT_S
from eventos.channels.readers import Page
from eventos.channels.senders import (
    Deferred,
    Delivered,
    Outgoing,
    Refused,
    SendOutcome,
    Unclear,
    http_category,
    unanswered,
)
from eventos.channels.threads import thread_id
from eventos.errors import EventOSError

DRIVER = "telegram"
TYPE_MESSAGE = "eventos.telegram.message"
GROUP_TYPES = ("group", "supergroup")
ALLOWED_UPDATES = ["message"]
PAGE_LIMIT = 100  # Telegram's own maximum per getUpdates
ANSWER_MAX_BYTES = 4 * 1024 * 1024  # a page of 100 updates is far below this
log = logging.getLogger(__name__)


class TelegramError(EventOSError):
    """Telegram answered `ok: false` (or not a Bot API answer)."""

    def __init__(self, code: int, description: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"telegram {code}: {description}")
        self.code = code
        self.description = description
        self.retry_after_s = retry_after_s


class TelegramApi:
    """Bot API calls over one HTTP client (`{api}/bot<token>/<method>`)."""

    def __init__(self, http: httpx.AsyncClient, base_url: str) -> None:
        self.http = http
        self.base_url = base_url.rstrip("/")

    async def call(self, token: bytes, method: str, params: dict[str, Any],
                   timeout_s: float) -> Any:  # fmt: skip
        """The method's `result`; TelegramError when Telegram says no; httpx errors as raised."""
        url = f"{self.base_url}/bot{token.decode()}/{method}"
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S))
        response = await self.http.post(url, json=params, timeout=timeout)
        try:
            doc = response.json() if len(response.content) <= ANSWER_MAX_BYTES else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or "ok" not in doc:
            raise TelegramError(response.status_code, "not a Bot API answer")
        if doc["ok"] is not True:
            retry = _obj(doc.get("parameters")).get("retry_after")
            code = int(doc.get("error_code") or response.status_code)
            retry_s = float(retry) if isinstance(retry, int | float) else None
            raise TelegramError(code, str(doc.get("description") or "")[:300], retry_s)
        return doc.get("result")


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _message_data(account: str, update: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    chat, sender = _obj(message.get("chat")), _obj(message.get("from"))
    text = message.get("text") if isinstance(message.get("text"), str) else message.get("caption")
    return {
        "account": account, "update_id": update.get("update_id"),
        "message_id": message.get("message_id"), "chat_type": chat.get("type"),
        "reply_to": str(chat.get("id")),
        "sender": {k: sender[k] for k in ("first_name", "last_name", "username") if k in sender},
        "text": text if isinstance(text, str) else None,
        "date": message.get("date"),
    }  # fmt: skip


def update_record(account_id: str, salt: bytes, update: dict[str, Any]) -> IngressRecord:
    """One update as an ingress record of source `telegram:<account>`: its thread the salted
    hash of its chat; an update that is not a chat message, or too large, a dead row."""
    account = account_id.partition(":")[2]
    event_id = new_event_id()
    message = update.get("message") if isinstance(update.get("message"), dict) else None
    chat = (message or {}).get("chat")
    status, error = names.INGRESS_ACCEPTED, None
    envelope: dict[str, Any] = {
        "specversion": "1.0", "id": event_id, "source": f"/channels/{DRIVER}/{account}",
        "type": TYPE_MESSAGE, "datacontenttype": "application/json",
    }  # fmt: skip
    if message is None or not isinstance(chat, dict) or "id" not in chat:
        status, error = names.INGRESS_DEAD, "not a chat message"
        envelope["data"] = {"account": account, "update_id": update.get("update_id")}
    else:
        envelope["subject"] = thread_id(salt, DRIVER, account, str(chat["id"]))
        envelope["time"] = _when(message.get("date"))
        if chat.get("type") in GROUP_TYPES:
            envelope[names.GROUP_ATTRIBUTE] = names.GROUP_CHAT
        envelope["data"] = _message_data(account, update, message)
    size = encoded_size(envelope)
    if size > names.ENVELOPE_MAX_BYTES:
        envelope["data"] = {"account": account, "update_id": update.get("update_id")}
        status, error = names.INGRESS_DEAD, f"update over {names.ENVELOPE_MAX_BYTES} bytes"
        size = encoded_size(envelope)
    return IngressRecord(
        source_key=account_id, dedupe_key=f"update:{update.get('update_id')}",
        type=TYPE_MESSAGE, chain_id=event_id, envelope=envelope, size=size,
        klass=None, status=status, error=error,
    )  # fmt: skip


def _when(date: object) -> str | None:
    if isinstance(date, int) and not isinstance(date, bool) and 0 < date < 2**33:
        return datetime.fromtimestamp(date, UTC).isoformat()
    return None


def next_offset(updates: list[dict[str, Any]], offset: int | None) -> int | None:
    """The offset that confirms a page: one above its highest update id."""
    ids = [u["update_id"] for u in updates if isinstance(u.get("update_id"), int)]
    return max(ids) + 1 if ids else offset


class TelegramReader:
    """One page of updates per call, from the account's cursor."""

    driver = DRIVER
    holds_unread = True  # Telegram keeps unconfirmed updates for 24 h

    def __init__(self, api: TelegramApi, poll_timeout_s: int) -> None:
        self.api = api
        self.poll_timeout_s = poll_timeout_s

    async def read(self, token: bytes, cursor: dict[str, Any], limit: int = PAGE_LIMIT) -> Page:
        """The next page of at most `limit` updates (waiting up to the poll timeout for one)
        and the cursor after it."""
        offset = cursor.get("offset") if isinstance(cursor.get("offset"), int) else None
        params: dict[str, Any] = {"timeout": self.poll_timeout_s,
                                  "limit": max(1, min(PAGE_LIMIT, limit)),
                                  "allowed_updates": ALLOWED_UPDATES}  # fmt: skip
        if offset is not None:
            params["offset"] = offset
        result = await self.api.call(token, "getUpdates", params, self.poll_timeout_s + 10)
        if not isinstance(result, list):
            raise TelegramError(0, "getUpdates did not answer a list")
        updates = [u for u in result if isinstance(u, dict)]
        return updates, {"offset": next_offset(updates, offset)}

    def record(self, account_id: str, salt: bytes, item: dict[str, Any]) -> IngressRecord:
        return update_record(account_id, salt, item)

    async def confirm(self, token: bytes, items: list[dict[str, Any]]) -> None:
        """Nothing: the next getUpdates, from the committed cursor, confirms the page."""


class TelegramSender:
    """`sendMessage` to the chat the reply answers."""

    driver = DRIVER
    idempotent = False  # the Bot API takes no idempotency key

    def __init__(self, api: TelegramApi, timeout_s: float) -> None:
        self.api = api
        self.timeout_s = timeout_s

    async def send(self, out: Outgoing) -> SendOutcome:
        params = {"chat_id": out.recipient, "text": out.body}
        try:
            result = await self.api.call(out.credential, "sendMessage", params, self.timeout_s)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return Deferred(f"telegram unreachable: {type(exc).__name__}")  # nothing was sent
        except httpx.HTTPError as exc:  # the request may have reached Telegram
            return Unclear(f"telegram did not answer: {type(exc).__name__}", unanswered(exc))
        except TelegramError as exc:
            if exc.code == 429:
                return Deferred(str(exc), exc.retry_after_s or 1.0)
            if exc.code >= 500 or exc.code == 0:
                return Unclear(str(exc), http_category(exc.code))
            return Refused(str(exc), http_category(exc.code))
        message_id = result.get("message_id") if isinstance(result, dict) else None
        return Delivered(str(message_id))
