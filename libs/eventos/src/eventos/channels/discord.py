"""Discord (SPEC §6.4): HTTP interactions in, channel messages and interaction answers out.

The account's credential is one JSON secret (`bot_token`, `application_id`, `public_key` hex,
optional `api` and `intents`). Interactions: Discord POSTs each command, signed with Ed25519
over timestamp + body; ingress verifies it (`verify`), appends it (`interaction_record`) and
only then answers "deferred" (type 5). The interaction's token lets anyone holding it answer the
interaction for 15 minutes, so it never travels or rests in the clear: `reply_to` carries it
sealed under a key derived from the bot token (`seal_token`), which only ingress and egress
hold; the envelope, the route, Temporal's history and the model's prompt see ciphertext.

Sender: a channel message is `POST /channels/{id}/messages` with a `nonce` (a digest of the
outbox idempotency key) and `enforce_nonce`, so a resend after an unclear outcome returns the
first message instead of making a second (`idempotent`); an interaction's answer edits its
deferred message (`PATCH .../messages/@original`), which a resend edits to the same text.
The gateway reader (channel messages in) is in `discord_gateway.py`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import nacl.exceptions
import nacl.secret
import nacl.signing

from eventos import failures, names
from eventos.bus.envelope import encoded_size, new_event_id
from eventos.bus.inbox import IngressRecord
from eventos.channels.http import CONNECT_TIMEOUT_S
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

DRIVER = "discord"
API = "https://discord.com/api/v10"
TYPE_MESSAGE = "eventos.discord.message"
TYPE_COMMAND = "eventos.discord.command"
GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT = 1 << 9, 1 << 12, 1 << 15
INTENTS = GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT
INTENTS_MAX = (1 << 26) - 1
CONTENT_MAX = 2000  # characters in one message
NONCE_MAX = 25
ANSWER_MAX_BYTES = 1024 * 1024
INTERACTION_PREFIX = "interaction:"
TOKEN_KEY_LABEL = b"eventos.discord.interaction-token\x00"
SNOWFLAKE = re.compile(r"[0-9]{1,20}")
ELLIPSIS = "…"
# Two attempts at the sender's timeout each stay inside the send activity's 30 s.
RESEND_PAUSE_S = 0.5


class DiscordError(EventOSError):
    """Discord answered an error (or something that is not a Discord answer)."""

    def __init__(self, status: int, code: int, message: str,
                 retry_after_s: float | None = None) -> None:  # fmt: skip
        super().__init__(f"discord {status} (code {code}): {message}")
        self.status, self.code, self.retry_after_s = status, code, retry_after_s


class DiscordCredentialError(EventOSError):
    """The account's credential secret is not a Discord credential (it never names the token)."""


@dataclass(frozen=True)
class DiscordCredential:
    bot_token: str = field(repr=False)
    application_id: str
    public_key: bytes  # Ed25519, 32 bytes
    api: str = API
    intents: int = INTENTS

    @property
    def authorization(self) -> dict[str, str]:
        return {"Authorization": f"Bot {self.bot_token}"}


def parse_credential(raw: bytes) -> DiscordCredential:
    """The JSON secret of a Discord account; DiscordCredentialError naming what is wrong."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise DiscordCredentialError("discord credential: the secret is not JSON") from None
    if not isinstance(doc, dict):
        raise DiscordCredentialError("discord credential: the secret must be a JSON object")
    unknown = sorted(set(doc) - {"bot_token", "application_id", "public_key", "api", "intents"})
    if unknown:
        raise DiscordCredentialError(f"discord credential: unknown fields {unknown}")
    token, app, key = doc.get("bot_token"), doc.get("application_id"), doc.get("public_key")
    if not isinstance(token, str) or not token.strip() or any(c.isspace() for c in token):
        raise DiscordCredentialError("discord credential: bot_token must be a non-empty string")
    if not isinstance(app, str) or not SNOWFLAKE.fullmatch(app):
        raise DiscordCredentialError(
            "discord credential: application_id must be a snowflake string"
        )
    try:
        public_key = bytes.fromhex(key) if isinstance(key, str) else b""
    except ValueError:
        public_key = b""
    if len(public_key) != 32:
        raise DiscordCredentialError("discord credential: public_key must be 64 hex characters")
    api = doc.get("api", API)
    if not isinstance(api, str) or not api.startswith(("https://", "http://")):
        raise DiscordCredentialError("discord credential: api must be an http(s) URL")
    intents = doc.get("intents", INTENTS)
    if isinstance(intents, bool) or not isinstance(intents, int) or not 0 <= intents <= INTENTS_MAX:
        raise DiscordCredentialError(f"discord credential: intents must be 0..{INTENTS_MAX}")
    return DiscordCredential(token, app, public_key, api.rstrip("/"), intents)


def verify(public_key: bytes, signature_hex: str | None, timestamp: str | None,
           body: bytes) -> bool:  # fmt: skip
    """Discord's interaction signature: Ed25519 over timestamp + body."""
    if not signature_hex or not timestamp:
        return False
    try:
        signature = bytes.fromhex(signature_hex)
        nacl.signing.VerifyKey(public_key).verify(timestamp.encode() + body, signature)
    except (ValueError, nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError):
        return False
    return True


# -- the interaction token, sealed ------------------------------------------------------------


def _token_box(cred: DiscordCredential) -> nacl.secret.SecretBox:
    key = hashlib.sha256(TOKEN_KEY_LABEL + cred.bot_token.encode()).digest()
    return nacl.secret.SecretBox(key)


def seal_token(cred: DiscordCredential, token: str) -> str:
    """The `reply_to` of an interaction: its application id and its token, sealed."""
    sealed = base64.urlsafe_b64encode(_token_box(cred).encrypt(token.encode())).decode()
    return f"{INTERACTION_PREFIX}{cred.application_id}:{sealed}"


def open_token(cred: DiscordCredential, reply_to: str) -> tuple[str, str] | None:
    """(application id, token) of an interaction's `reply_to`; None when it cannot be opened
    (another bot's, or sealed under a bot token since rotated)."""
    app, _, sealed = reply_to[len(INTERACTION_PREFIX) :].partition(":")
    try:
        token = _token_box(cred).decrypt(base64.urlsafe_b64decode(sealed.encode())).decode()
    except (ValueError, nacl.exceptions.CryptoError, UnicodeDecodeError):
        return None
    return app, token


# -- records ----------------------------------------------------------------------------------


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def person(user: dict[str, Any]) -> dict[str, Any]:
    """What a record keeps of a user: names, never the id."""
    return {k: user[k] for k in ("username", "global_name") if isinstance(user.get(k), str)}


def render_options(options: object, depth: int = 0) -> str:
    """A command's options as text: `name: value`, subcommands by name (three levels deep)."""
    parts: list[str] = []
    for opt in options if isinstance(options, list) and depth < 3 else []:
        if not isinstance(opt, dict) or not isinstance(opt.get("name"), str):
            continue
        if "options" in opt or opt.get("type") in (1, 2):  # a subcommand (group)
            parts.append(f"{opt['name']} {render_options(opt.get('options'), depth + 1)}".strip())
        elif isinstance(opt.get("value"), str | int | float | bool):
            parts.append(f"{opt['name']}: {opt['value']}")
    return " ".join(parts)


def _envelope(account: str, kind: str, event_id: str) -> dict[str, Any]:
    return {"specversion": "1.0", "id": event_id, "source": f"/channels/{DRIVER}/{account}",
            "type": kind, "datacontenttype": "application/json"}  # fmt: skip


def _finish(account_id: str, dedupe_key: str, kind: str, envelope: dict[str, Any],
            stub: dict[str, Any], error: str | None) -> IngressRecord:  # fmt: skip
    """The record; a dead row (its stub data kept) when `error` is set or it is too large."""
    size = encoded_size(envelope)
    if error is None and size > names.ENVELOPE_MAX_BYTES:
        error = f"{kind} over {names.ENVELOPE_MAX_BYTES} bytes"
    if error is not None:
        envelope = {**{k: v for k, v in envelope.items() if k != "data"}, "data": stub}
        size = encoded_size(envelope)
    return IngressRecord(
        source_key=account_id, dedupe_key=dedupe_key, type=kind, chain_id=envelope["id"],
        envelope=envelope, size=size, klass=None,
        status=names.INGRESS_DEAD if error else names.INGRESS_ACCEPTED, error=error,
    )  # fmt: skip


def interaction_record(account_id: str, salt: bytes, cred: DiscordCredential,
                       interaction: dict[str, Any]) -> IngressRecord:  # fmt: skip
    """An application command as a record of source `discord:<account>`: its thread the salted
    hash of its channel (of its user in a DM); its `reply_to` the sealed follow-up target."""
    account = account_id.partition(":")[2]
    event_id, iid = new_event_id(), str(interaction.get("id"))
    envelope = _envelope(account, TYPE_COMMAND, event_id)
    data, guild = _obj(interaction.get("data")), _str(interaction.get("guild_id"))
    who = _obj(_obj(interaction.get("member")).get("user")) or _obj(interaction.get("user"))
    channel, token = _str(interaction.get("channel_id")), _str(interaction.get("token"))
    stub = {"account": account, "interaction_id": iid}
    error = None
    if not channel or not token or not isinstance(data.get("name"), str):
        error = "not an application command"
    elif not guild and not isinstance(who.get("id"), str):
        error = "a direct command without a user"
    else:
        address = channel if guild else str(who["id"])
        envelope["subject"] = thread_id(salt, DRIVER, account, address)
        if guild:
            envelope[names.GROUP_ATTRIBUTE] = names.GROUP_CHAT
        text = f"/{data['name']} {render_options(data.get('options'))}".strip()
        envelope["data"] = {
            **stub, "reply_to": seal_token(cred, token), "text": text, "command": data["name"],
            "author": person(who), "channel_id": channel, "guild_id": guild,
        }  # fmt: skip
    return _finish(account_id, f"interaction:{iid}", TYPE_COMMAND, envelope, stub, error)


def message_record(account_id: str, salt: bytes, message: dict[str, Any]) -> IngressRecord:
    """A MESSAGE_CREATE as a record: its thread the salted hash of its channel (of its author
    in a DM), `reply_to` the channel."""
    account = account_id.partition(":")[2]
    event_id, mid = new_event_id(), str(message.get("id"))
    envelope = _envelope(account, TYPE_MESSAGE, event_id)
    channel, guild = _str(message.get("channel_id")), _str(message.get("guild_id"))
    author = _obj(message.get("author"))
    stub = {"account": account, "message_id": mid}
    error = None
    if not channel or not isinstance(author.get("id"), str):
        error = "not a channel message"
    else:
        envelope["subject"] = thread_id(salt, DRIVER, account, channel if guild else author["id"])
        if guild:
            envelope[names.GROUP_ATTRIBUTE] = names.GROUP_CHAT
        envelope["time"] = _when(message.get("timestamp"))
        envelope["data"] = {
            **stub, "reply_to": channel, "text": _str(message.get("content")),
            "author": person(author), "channel_id": channel, "guild_id": guild,
        }  # fmt: skip
    return _finish(account_id, f"message:{mid}", TYPE_MESSAGE, envelope, stub, error)


def _when(stamp: object) -> str | None:
    try:
        return datetime.fromisoformat(stamp).isoformat() if isinstance(stamp, str) else None
    except ValueError:
        return None


# -- REST -------------------------------------------------------------------------------------


class DiscordApi:
    """REST calls with the bot's credential; a DiscordError for every non-2xx answer."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def call(self, cred: DiscordCredential, method: str, path: str, timeout_s: float,
                   body: dict[str, Any] | None = None, *,
                   bot: bool = True) -> dict[str, Any]:  # fmt: skip
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S))
        headers = cred.authorization if bot else {}
        response = await self.http.request(method, f"{cred.api}{path}", json=body,
                                           headers=headers, timeout=timeout)  # fmt: skip
        try:
            doc = response.json() if len(response.content) <= ANSWER_MAX_BYTES else None
        except ValueError:
            doc = None
        if response.is_success and isinstance(doc, dict):
            return doc
        doc = _obj(doc)
        retry = doc.get("retry_after", response.headers.get("retry-after"))
        try:
            retry_s = float(retry) if retry is not None else None
        except (TypeError, ValueError):
            retry_s = None
        code = int(doc["code"]) if isinstance(doc.get("code"), int) else 0
        message = str(doc.get("message") or ("not a Discord answer" if response.is_success
                                             else response.reason_phrase))[:300]  # fmt: skip
        status = response.status_code if not response.is_success else 0
        raise DiscordError(status, code, message, retry_s)


def nonce(idempotency_key: str, part: int) -> str:
    """A message's nonce: 25 hex characters of a digest of the outbox key (and part)."""
    key = idempotency_key if part == 0 else f"{idempotency_key}:{part}"
    return hashlib.sha256(key.encode()).hexdigest()[:NONCE_MAX]


def parts(body: str) -> list[str]:
    """A body as messages of at most CONTENT_MAX characters (split at a line or a space)."""
    out: list[str] = []
    rest = body
    while len(rest) > CONTENT_MAX:
        cut = max(rest.rfind("\n", 0, CONTENT_MAX), rest.rfind(" ", 0, CONTENT_MAX))
        cut = cut if cut > CONTENT_MAX // 2 else CONTENT_MAX
        out.append(rest[:cut])
        rest = rest[cut:].lstrip("\n ") if cut < CONTENT_MAX else rest[cut:]
    return [*out, rest] if rest or not out else out


class DiscordSender:
    """Channel messages with an enforced nonce; interaction answers by editing the deferred one."""

    driver = DRIVER
    idempotent = True  # a nonce-enforced create and an edit both answer a resend with the first

    def __init__(self, api: DiscordApi, timeout_s: float) -> None:
        self.api = api
        self.timeout_s = timeout_s

    async def send(self, out: Outgoing) -> SendOutcome:
        """One send; an unclear attempt is made again once at once, with the same nonce (or
        the same edit), which Discord answers with the first message if that one arrived."""
        try:
            cred = parse_credential(out.credential)
        except DiscordCredentialError as exc:
            return Refused(str(exc), failures.AUTH)
        outcome = await self._attempt(cred, out)
        if isinstance(outcome, Unclear):
            await asyncio.sleep(RESEND_PAUSE_S)
            outcome = await self._attempt(cred, out)
        return outcome

    async def _attempt(self, cred: DiscordCredential, out: Outgoing) -> SendOutcome:
        try:
            if out.recipient.startswith(INTERACTION_PREFIX):
                return await self._answer(cred, out)
            if not SNOWFLAKE.fullmatch(out.recipient):
                return Refused("not a Discord channel id")
            return await self._post(cred, out)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return Deferred(f"discord unreachable: {type(exc).__name__}")  # nothing was sent
        except httpx.HTTPError as exc:  # the request may have reached Discord
            return Unclear(f"discord did not answer: {type(exc).__name__}", unanswered(exc))
        except DiscordError as exc:
            if exc.status == 429:
                return Deferred(str(exc), exc.retry_after_s or 1.0)
            if exc.status >= 500 or exc.status == 0:
                return Unclear(str(exc), http_category(exc.status))
            return Refused(str(exc), http_category(exc.status))

    async def _post(self, cred: DiscordCredential, out: Outgoing) -> SendOutcome:
        first: str | None = None
        for n, content in enumerate(parts(out.body)):
            body = {"content": content, "nonce": nonce(out.idempotency_key, n),
                    "enforce_nonce": True, "allowed_mentions": {"parse": []}}  # fmt: skip
            message = await self.api.call(cred, "POST", f"/channels/{out.recipient}/messages",
                                          self.timeout_s, body)  # fmt: skip
            first = first or str(message.get("id"))
        return Delivered(first or "")

    async def _answer(self, cred: DiscordCredential, out: Outgoing) -> SendOutcome:
        opened = open_token(cred, out.recipient)
        if opened is None:
            return Refused("the interaction token cannot be opened with this bot's credential")
        app, token = opened
        content = out.body
        if len(content) > CONTENT_MAX:  # one answer per interaction: an edit stays idempotent
            content = content[: CONTENT_MAX - 1] + ELLIPSIS
        body = {"content": content, "allowed_mentions": {"parse": []}}
        path = f"/webhooks/{app}/{token}/messages/@original"
        message = await self.api.call(cred, "PATCH", path, self.timeout_s, body, bot=False)
        return Delivered(str(message.get("id")))
