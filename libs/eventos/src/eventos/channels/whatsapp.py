"""WhatsApp Business (Cloud API, SPEC §6.4): what Meta's webhook brings in, and the sender.

Credential: the account NAME's secret is one JSON document, `{phone_number_id, access_token,
app_secret, verify_token, graph_api?, graph_version?, template?: {name, language}}`.

In: each `messages[]` entry of a notification is one record of source
`whatsapp_business:<account>` deduplicated by its `wamid` (Meta retries an unanswered
notification for days), its thread the salted hash of the customer's wa_id; an entry that is
not a message is a dead row with its reason, and its neighbours still land. Each message opens
the customer's 24-hour window (`whatsapp_windows`, written in the append's transaction).
`statuses[]` move the `receipt` of the sent row whose provider id is that wamid; they are not
inputs.

Out: `POST {graph_api}/{version}/{phone_number_id}/messages`, a text answering the customer's
last message. The Cloud API takes no idempotency key, so a send is at most once (`unknown`
when the call may have reached Meta). Outside the window a reply is held `window_closed`, or
with a template configured the template goes instead (the customer's answer reopens the window).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.bus.envelope import encoded_size, new_event_id
from eventos.bus.inbox import IngressRecord
from eventos.channels.http import CONNECT_TIMEOUT_S
from eventos.channels.senders import (
    Deferred,
    Delivered,
    Held,
    Outgoing,
    Refused,
    SendOutcome,
    Unclear,
    http_category,
    unanswered,
)
from eventos.channels.threads import counterpart_hash, instance_salt, thread_id
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import DatabaseUnavailable, SecretUnavailable
from eventos.failures import AUTH, OUTAGE

DRIVER = "whatsapp_business"
TYPE_MESSAGE = "eventos.whatsapp.message"
GRAPH_API = "https://graph.facebook.com"
GRAPH_VERSION = "v21.0"
WINDOW_S = 24 * 3600.0
TEXT_MAX = 4096  # characters of a text message's body
ID_MAX = 256  # a wamid is about 60 characters; anything far longer is not one
NAME_MAX = 256
ANSWER_MAX_BYTES = 1024 * 1024
RECEIPTS = ("sent", "delivered", "read", "failed")  # a receipt only moves right
# Graph error codes: the number's throughput (with the delay to wait), the pair rate (the
# recipient's bucket paces the retries), the closed window.
THROUGHPUT_CODES = {130429: 1.0, 4: 60.0, 80007: 60.0}
PAIR_RATE_CODE = 131056
WINDOW_CLOSED_CODE = 131047
_VERSION = re.compile(r"^v\d{1,3}\.\d{1,3}$")
_DIGITS = re.compile(r"^\d{1,32}$")
_WAMID = re.compile(r"^[A-Za-z0-9._:=+/-]{1,256}$")  # `wamid.` and base64 in Meta's ids
# Types whose content is a caption, a button's text or a reply's title, kept as the text.
_CAPTIONED = ("image", "video", "document")


class CredentialInvalid(SecretUnavailable):
    """The account's secret is not the JSON credential WhatsApp needs (says which part)."""


@dataclass(frozen=True)
class Template:
    name: str
    language: str


@dataclass(frozen=True)
class Credential:
    """A WhatsApp Business account's credential, parsed from its JSON secret."""

    phone_number_id: str
    access_token: str = field(repr=False)
    app_secret: str = field(repr=False)
    verify_token: str = field(repr=False)
    graph_api: str = GRAPH_API
    graph_version: str = GRAPH_VERSION
    template: Template | None = None

    @property
    def messages_url(self) -> str:
        return f"{self.graph_api}/{self.graph_version}/{self.phone_number_id}/messages"


def parse_credential(raw: bytes, ref: str) -> Credential:
    """The credential in `raw`; CredentialInvalid naming what is wrong (never a value)."""
    where = f"the secret {ref!r} of a WhatsApp account"
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CredentialInvalid(f"{where} must be JSON {{phone_number_id, access_token, "
                                "app_secret, verify_token, ...}}") from None  # fmt: skip
    if not isinstance(doc, dict):
        raise CredentialInvalid(f"{where} must be a JSON object")
    unknown = set(doc) - {"phone_number_id", "access_token", "app_secret", "verify_token",
                          "graph_api", "graph_version", "template"}  # fmt: skip
    if unknown:
        raise CredentialInvalid(f"{where} has unknown keys {sorted(unknown)}")

    def text(key: str, default: str | None = None) -> str:
        value = doc.get(key, default)
        if not isinstance(value, str) or not value.strip():
            raise CredentialInvalid(f"{where} needs {key} (a non-empty string)")
        return value.strip()

    pnid = text("phone_number_id")
    if not _DIGITS.match(pnid):
        raise CredentialInvalid(f"{where}: phone_number_id must be digits")
    api = text("graph_api", GRAPH_API).rstrip("/")
    if not api.startswith(("https://", "http://")):
        raise CredentialInvalid(f"{where}: graph_api must be an http(s) URL")
    version = text("graph_version", GRAPH_VERSION)
    if not _VERSION.match(version):
        raise CredentialInvalid(f"{where}: graph_version must look like v21.0")
    return Credential(pnid, text("access_token"), text("app_secret"), text("verify_token"),
                      api, version, _template(doc.get("template"), where))  # fmt: skip


def _template(value: object, where: str) -> Template | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"name", "language"}:
        raise CredentialInvalid(f"{where}: template must be {{name, language}}")
    name, language = value["name"], value["language"]
    if not all(isinstance(v, str) and v.strip() for v in (name, language)):
        raise CredentialInvalid(f"{where}: template name and language are non-empty strings")
    return Template(name.strip(), language.strip())


# --- in: a notification's entries -------------------------------------------------------------


@dataclass(frozen=True)
class WindowTouch:
    """A customer's message as the window sees it (the customer by hash only)."""

    counterpart: str
    at: datetime
    wamid: str


@dataclass(frozen=True)
class Receipt:
    wamid: str
    status: str
    body: dict[str, Any]


@dataclass
class Notification:
    """What one verified notification brings: records to append, windows, receipts."""

    records: list[IngressRecord] = field(default_factory=list)
    windows: list[WindowTouch] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: object, limit: int = ID_MAX) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= limit else None


def _wamid(value: object) -> str | None:
    return value if isinstance(value, str) and _WAMID.match(value) else None


def _clean(text: str) -> str:
    """Text PostgreSQL can store in jsonb: no NUL, no lone surrogate."""
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def _when(timestamp: object, now: datetime) -> datetime:
    """Meta's unix-seconds string as a time, never later than now (a hostile future date
    would hold a window open); missing or malformed: now."""
    if isinstance(timestamp, str) and timestamp.isdigit() and len(timestamp) <= 12:
        return min(datetime.fromtimestamp(int(timestamp), UTC), now)
    return now


def read_notification(account_id: str, salt: bytes, cred: Credential, payload: object,
                      now: datetime) -> Notification:  # fmt: skip
    """Every `messages[]` entry as a record (a malformed one dead with its reason), every
    `statuses[]` entry as a receipt; a change for another number or field is a dead row."""
    out = Notification()
    doc = _obj(payload)
    if doc.get("object") != "whatsapp_business_account" or not isinstance(doc.get("entry"), list):
        out.records.append(dead_record(account_id, _digest(payload), "not a WhatsApp notification"))
        return out
    for entry in doc["entry"]:
        for change in _list(_obj(entry).get("changes")):
            _read_change(out, account_id, salt, cred, _obj(change), now)
    return out


def _read_change(out: Notification, account_id: str, salt: bytes, cred: Credential,
                 change: dict[str, Any], now: datetime) -> None:  # fmt: skip
    value = _obj(change.get("value"))
    pnid = _obj(value.get("metadata")).get("phone_number_id")
    if change.get("field") != "messages" or pnid != cred.phone_number_id:
        why = (f"field {str(change.get('field'))[:40]!r} is not read"
               if change.get("field") != "messages" else "for another phone number")  # fmt: skip
        out.records.append(dead_record(account_id, _digest(change), why))
        return
    names_by_id = {c.get("wa_id"): _obj(c.get("profile")).get("name")
                   for c in map(_obj, _list(value.get("contacts")))}  # fmt: skip
    for message in _list(value.get("messages")):
        record, touch = message_record(account_id, salt, message, names_by_id, now)
        out.records.append(record)
        if touch is not None:
            out.windows.append(touch)
    for status in _list(value.get("statuses")):
        receipt = _receipt(_obj(status), now)
        if receipt is not None:
            out.receipts.append(receipt)


def _digest(value: object) -> str:
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except (ValueError, RecursionError):  # nesting too deep for the encoder
        text = repr(type(value))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def dead_record(account_id: str, key: str, reason: str, wamid: str | None = None) -> IngressRecord:
    """An entry that is not a message, stored dead with its reason (not its content)."""
    account = account_id.partition(":")[2]
    event_id = new_event_id()
    envelope: dict[str, Any] = {
        "specversion": "1.0", "id": event_id, "source": f"/channels/{DRIVER}/{account}",
        "type": TYPE_MESSAGE, "data": {"account": account, "wamid": wamid},
    }  # fmt: skip
    return IngressRecord(
        source_key=account_id, dedupe_key=f"wamid:{wamid}" if wamid else f"sha256:{key}",
        type=TYPE_MESSAGE, chain_id=event_id, envelope=envelope, size=encoded_size(envelope),
        status=names.INGRESS_DEAD, error=reason,
    )  # fmt: skip


def _content(message: dict[str, Any], kind: str) -> str | None:
    """A message's text: the body, a caption, a button's text or a reply's title."""
    part = _obj(message.get(kind))
    if kind == "text":
        text = part.get("body")
    elif kind in _CAPTIONED:
        text = part.get("caption")
    elif kind == "button":
        text = part.get("text")
    elif kind == "interactive":
        reply = _obj(part.get("button_reply")) or _obj(part.get("list_reply"))
        text = reply.get("title")
    else:
        text = None
    return text if isinstance(text, str) and text else None


def message_record(
    account_id: str, salt: bytes, message: object, names_by_id: dict[Any, Any], now: datetime
) -> tuple[IngressRecord, WindowTouch | None]:
    """One `messages[]` entry as a record, and the window it opens (None for a dead one)."""
    account = account_id.partition(":")[2]
    msg = _obj(message)
    wamid, wa_id, kind = _wamid(msg.get("id")), msg.get("from"), _wamid(msg.get("type"))
    if wamid is None:
        return dead_record(account_id, _digest(message), "a message without an id"), None
    if not isinstance(wa_id, str) or not _DIGITS.match(wa_id):
        return dead_record(account_id, "", "a message without a sender", wamid), None
    if kind is None:
        return dead_record(account_id, "", "a message without a type", wamid), None
    at = _when(msg.get("timestamp"), now)
    name, ts = _str(names_by_id.get(wa_id), NAME_MAX), msg.get("timestamp")
    event_id = new_event_id()
    envelope: dict[str, Any] = {
        "specversion": "1.0", "id": event_id, "source": f"/channels/{DRIVER}/{account}",
        "type": TYPE_MESSAGE, "datacontenttype": "application/json",
        "subject": thread_id(salt, DRIVER, account, wa_id), "time": at.isoformat(),
        "data": {"account": account, "reply_to": wa_id, "text": _content(msg, kind),
                 "wamid": wamid, "name": _clean(name) if name else None,
                 "timestamp": ts if isinstance(ts, str) and ts.isdigit() and len(ts) <= 12
                 else None, "type": kind},
    }  # fmt: skip
    try:
        size = encoded_size(envelope)
    except UnicodeEncodeError:  # a lone surrogate: the row could never be stored
        return dead_record(account_id, "", "a message with unstorable text", wamid), None
    if size > names.ENVELOPE_MAX_BYTES:
        reason = f"message over {names.ENVELOPE_MAX_BYTES} bytes"
        return dead_record(account_id, "", reason, wamid), None
    record = IngressRecord(
        source_key=account_id, dedupe_key=f"wamid:{wamid}", type=TYPE_MESSAGE,
        chain_id=event_id, envelope=envelope, size=size,
    )  # fmt: skip
    touch = WindowTouch(counterpart_hash(salt, DRIVER, account, wa_id), at, wamid)
    return record, touch


def _receipt(status: dict[str, Any], now: datetime) -> Receipt | None:
    wamid, state = _wamid(status.get("id")), status.get("status")
    if wamid is None or state not in RECEIPTS:
        return None  # not a delivery status of ours: nothing to update
    body: dict[str, Any] = {"status": state, "at": _when(status.get("timestamp"), now).isoformat()}
    errors = [{"code": e["code"] if isinstance(e.get("code"), int) else None,
               "title": _clean(e["title"][:200]) if isinstance(e.get("title"), str) else None}
              for e in map(_obj, _list(status.get("errors"))[:5])]  # fmt: skip
    if errors:
        body["errors"] = errors
    return Receipt(wamid, str(state), body)


# --- out: the sender ---------------------------------------------------------------------------


class GraphError(Exception):
    """A Graph API error answer (`{"error": {code, message, ...}}`)."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(f"whatsapp {status} (#{code}): {message}")
        self.status, self.code = status, code


def _graph_error(response: httpx.Response, doc: object) -> GraphError:
    error = _obj(_obj(doc).get("error"))
    code = error.get("code")
    message = error.get("message")
    text = _clean(message[:300]) if isinstance(message, str) else "not a Graph answer"
    return GraphError(response.status_code, code if isinstance(code, int) else 0, text)


def text_request(to: str, body: str, context: str | None) -> dict[str, Any]:
    request: dict[str, Any] = {"messaging_product": "whatsapp", "recipient_type": "individual",
                               "to": to, "type": "text", "text": {"body": body}}  # fmt: skip
    if context:
        request["context"] = {"message_id": context}
    return request


def template_request(to: str, template: Template) -> dict[str, Any]:
    chosen = {"name": template.name, "language": {"code": template.language}}
    return {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to,
            "type": "template", "template": chosen}  # fmt: skip


class WhatsAppSender:
    """A text to the customer inside the window; held (or a template) outside it."""

    driver = DRIVER
    idempotent = False  # the Cloud API takes no idempotency key

    def __init__(self, http: httpx.AsyncClient, pool: AsyncConnectionPool[Conn],
                 timeout_s: float) -> None:  # fmt: skip
        self.http, self.pool, self.timeout_s = http, pool, timeout_s
        self._salt: bytes | None = None

    async def send(self, out: Outgoing) -> SendOutcome:
        try:
            cred = parse_credential(out.credential, out.account)
        except CredentialInvalid as exc:
            return Refused(str(exc), AUTH)
        if not out.body.strip():
            return Refused("an empty reply")
        if len(out.body) > TEXT_MAX:
            return Refused(f"a reply over {TEXT_MAX} characters")
        try:
            window = await self._window(out)
        except (DatabaseUnavailable, OSError) as exc:
            return Deferred(f"the customer's window could not be read: {exc}")
        outcome: SendOutcome = Held(names.HELD_WINDOW_CLOSED)
        if window is not None:
            outcome = await self._call(cred, text_request(out.recipient, out.body, window))
        if isinstance(outcome, Held) and cred.template is not None:
            return await self._call(cred, template_request(out.recipient, cred.template))
        return outcome

    async def _window(self, out: Outgoing) -> str | None:
        """The customer's last message id while the window is open (None: closed)."""
        async with self.pool.connection() as conn:
            if self._salt is None:
                self._salt = await instance_salt(conn)
            params = {"account": f"{DRIVER}:{out.account}",
                      "counterpart": counterpart_hash(self._salt, DRIVER, out.account,
                                                      out.recipient)}  # fmt: skip
            cur = await conn.execute(Q["whatsapp_window_get"], params)
            row = await cur.fetchone()
        if row is None or float(row["age_s"]) >= WINDOW_S:
            return None
        return str(row["last_wamid"])

    async def _call(self, cred: Credential, request: dict[str, Any]) -> SendOutcome:
        headers = {"Authorization": f"Bearer {cred.access_token}"}
        timeout = httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, CONNECT_TIMEOUT_S))
        try:
            response = await self.http.post(cred.messages_url, json=request, headers=headers,
                                            timeout=timeout)  # fmt: skip
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return Deferred(f"whatsapp unreachable: {type(exc).__name__}")  # nothing was sent
        except httpx.HTTPError as exc:  # the request may have reached Meta
            return Unclear(f"whatsapp did not answer: {type(exc).__name__}", unanswered(exc))
        try:
            doc = response.json() if len(response.content) <= ANSWER_MAX_BYTES else None
        except ValueError:
            doc = None
        if response.status_code == 200:
            messages = _list(_obj(doc).get("messages"))
            wamid = _wamid(_obj(messages[0]).get("id")) if messages else None
            return Delivered(wamid) if wamid else Unclear("whatsapp answered 200 without an id")
        return _outcome(_graph_error(response, doc))


def _outcome(exc: GraphError) -> SendOutcome:
    """What a Graph error means for the send (SPEC §11)."""
    if exc.code in THROUGHPUT_CODES:
        return Deferred(str(exc), THROUGHPUT_CODES[exc.code])
    if exc.code == PAIR_RATE_CODE:
        return Deferred(str(exc))  # this customer only: the account is not paused
    if exc.code == WINDOW_CLOSED_CODE:
        return Held(names.HELD_WINDOW_CLOSED)
    if exc.status == 429:
        return Deferred(str(exc), 1.0)
    if exc.status >= 500 or exc.status < 400:
        return Unclear(str(exc), http_category(exc.status) if exc.status >= 500 else OUTAGE)
    return Refused(str(exc), http_category(exc.status))
