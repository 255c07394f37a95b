"""Discord's side of HTTP interactions, for the fake: it POSTs a realistic interaction to our
endpoint, signed with the application's Ed25519 key over timestamp + body (headers
X-Signature-Ed25519 / X-Signature-Timestamp), waits at most 3 s as Discord does, and judges the
answer: PONG (1) to a ping; 4 (a message) or 5 (deferred) to a command; anything else, or
nothing in time, is "This interaction failed" and the token is dead. A live token takes
follow-ups for 15 minutes of the owner's clock.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from nacl.signing import SigningKey

ANSWER_WINDOW_S = 3.0
TOKEN_TTL_S = 15 * 60.0
CONTENT_MAX = 2000
LOADING, EPHEMERAL = 1 << 7, 1 << 6  # message flags
FAILED = "This interaction failed"
PERMISSIONS = "2248473465835073"


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


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def user(user_id: str, *, bot: bool = False) -> dict[str, Any]:
    """A user object."""
    name = "eventos-fake" if bot else f"user{user_id[-4:]}"
    return {"id": user_id, "username": name, "global_name": None if bot else name.title(),
            "discriminator": "0", "avatar": None, "public_flags": 0, **({"bot": True} if bot else {})}  # fmt: skip


def option_type(value: Any) -> int:
    """Application command option types: STRING 3, INTEGER 4, BOOLEAN 5, NUMBER 10."""
    if isinstance(value, bool):
        return 5
    return 4 if isinstance(value, int) else 10 if isinstance(value, float) else 3


Answered = Callable[[Interaction, str, int], Awaitable[dict[str, Any]]]


class InteractionCaller:
    """`answered(interaction, content, flags)` makes the original message of an accepted answer."""

    def __init__(
        self, application_id: str, clock: Callable[[], float], new_id: Callable[[], str],
        answered: Answered,
    ) -> None:  # fmt: skip
        self.application_id, self.clock, self.new_id, self.answered = application_id, clock, new_id, answered  # fmt: skip
        self.signing_key = SigningKey.generate()
        self.records: dict[str, Interaction] = {}  # by token

    @property
    def public_key(self) -> str:
        """The application's Ed25519 public key, hex, as the Developer Portal shows it."""
        return bytes(self.signing_key.verify_key).hex()

    async def interact(
        self,
        url: str,
        *,
        type: int = 2,
        name: str = "ask",
        channel_id: str,
        user_id: str,
        guild_id: str | None,
        options: Mapping[str, str | int | float | bool] | None = None,
        tamper: str | None = None,
    ) -> Reply:
        """POST a signed interaction (type 2 command or 1 ping) and judge the answer as Discord."""
        inter = self._new(channel_id, guild_id)
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

    def live(self, application_id: str, token: str) -> Interaction | None:
        """The interaction a webhook token is for, while it can take follow-ups."""
        inter = self.records.get(token)
        if inter is None or not inter.valid or inter.answer_type not in (4, 5):
            return None
        fresh = self.clock() - inter.sent_at <= TOKEN_TTL_S
        return inter if fresh and application_id == self.application_id else None

    def _new(self, channel_id: str, guild_id: str | None) -> Interaction:
        iid = self.new_id()
        raw = f"interaction:{iid}:{secrets.token_hex(48)}".encode()
        token = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        self.records[token] = Interaction(iid, token, channel_id, guild_id, self.clock())
        return self.records[token]

    def _payload(
        self, inter: Interaction, kind: int, name: str, channel_id: str, user_id: str,
        guild_id: str | None, options: Mapping[str, Any],
    ) -> bytes:  # fmt: skip
        payload: dict[str, Any] = {
            "id": inter.id, "application_id": self.application_id, "type": kind,
            "token": inter.token, "version": 1, "entitlements": [], "app_permissions": PERMISSIONS,
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
                member: dict[str, Any] = {"user": user(user_id), "roles": [], "permissions": PERMISSIONS,
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
        content, flags = data.get("content") or "", data.get("flags") or 0
        if not isinstance(content, str) or len(content) > CONTENT_MAX or not isinstance(flags, int):
            return FAILED
        if answer == 4 and not content and not data.get("embeds"):
            return FAILED
        inter.answer_type = answer
        inter.original = await self.answered(inter, content, flags & EPHEMERAL | (LOADING if answer == 5 else 0))  # fmt: skip
        return None
