"""A loopback fake of the WhatsApp Business Cloud API, served over real HTTP on 127.0.0.1.

Our side calls it: `POST {base_url}/{version}/{phone_number_id}/messages` with a bearer token
answers `{"messaging_product", "contacts": [{input, wa_id}], "messages": [{id: "wamid..."}]}`
or a Graph error object `{"error": {message, type, code, error_data: {messaging_product,
details}, fbtrace_id}}`: 190 for a bad token, 100 for an invalid parameter, 131047 outside the
24 h customer-service window (a text to a customer who last wrote over 24 h ago; templates pass),
130429 past the number's throughput, 131056 past the pair rate. Meta's table gives the HTTP
status of the two limits inconsistently across sources; HTTP_STATUS holds ours. Sends are
recorded; the next calls of a number can fail, hang or break off (see fake_server).

It plays Meta calling us too: the `hub.challenge` verification GET, signed `messages` and
`statuses` notifications (`X-Hub-Signature-256: sha256=<HMAC-SHA256(app secret, raw body)>`),
and redelivery of a notification our endpoint did not answer 2xx, as Meta retries them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass, field

import httpx
from fake_server import Fault, Json, LoopbackFake, Windows
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

VERSION = re.compile(r"^v\d+\.\d+$")
MAX_BODY = 4096
WINDOW_S = 24 * 3600.0
TYPES = {"text", "template", "image", "audio", "video", "document", "sticker", "location",
         "contacts", "interactive", "reaction"}  # fmt: skip
HTTP_STATUS = {130429: 400, 131056: 429, 131047: 400, 100: 400, 33: 400}
TITLES = {
    131047: ("Re-engagement message", "Message failed to send because more than 24 hours have "
             "passed since the customer last replied to this number."),
    130429: ("Rate limit hit", "Cloud API message throughput has been reached."),
    131056: ("(Business Account, Consumer Account) pair rate limit hit", "Message failed to send "
             "because there were too many messages sent from this phone number to the same "
             "phone number in a short period of time."),
    131026: ("Message undeliverable", "Message failed to send because the recipient is not a "
             "WhatsApp user or has not accepted the terms."),
}  # fmt: skip
ERROR_HREF = "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/"
WEBHOOK_TIMEOUT_S = 10.0


class GraphError(Exception):
    def __init__(self, code: int, message: str, details: str | None = None, *,
                 status: int | None = None, subcode: int | None = None,
                 kind: str = "OAuthException") -> None:  # fmt: skip
        super().__init__(message)
        self.code, self.message, self.details, self.subcode = code, message, details, subcode
        self.status, self.kind = status or HTTP_STATUS.get(code, 400), kind

    def body(self) -> Json:
        error: Json = {"message": self.message, "type": self.kind, "code": self.code}
        if self.subcode is not None:
            error["error_subcode"] = self.subcode
        if self.details is not None:
            error["error_data"] = {"messaging_product": "whatsapp", "details": self.details}
        error["fbtrace_id"] = "A" + secrets.token_urlsafe(16)
        return {"error": error}


def titled(code: int) -> GraphError:
    """The error Meta answers for one of the codes in TITLES."""
    title, details = TITLES[code]
    return GraphError(code, f"(#{code}) {title}", details)


def invalid(message: str) -> GraphError:
    return GraphError(100, f"(#100) {message}", message)


@dataclass
class Limits:
    """Sliding windows (messages, seconds) per business number and per (number, customer)."""

    throughput: tuple[int, float] | None = (80, 1.0)
    pair: tuple[int, float] | None = (10, 60.0)  # "about 1 every 6 s", bursts allowed


@dataclass
class Number:
    phone_number_id: str
    display_phone_number: str
    token: str
    waba_id: str
    sent: list[Json] = field(default_factory=list)
    windows: Windows = field(default_factory=Windows)


@dataclass
class Delivery:
    """One notification as Meta sent it, and the HTTP status of each attempt (0: no answer)."""

    url: str
    body: bytes
    headers: dict[str, str]
    attempts: list[int] = field(default_factory=list)
    retry_after: str | None = None  # the last answer's Retry-After

    @property
    def delivered(self) -> bool:
        return bool(self.attempts) and 200 <= self.attempts[-1] < 300

    @property
    def payload(self) -> Json:
        parsed: Json = json.loads(self.body)
        return parsed


@dataclass(frozen=True)
class Verification:
    status: int
    body: str
    challenge: str

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.body == self.challenge


class FakeWhatsApp(LoopbackFake):
    what = "the fake WhatsApp Cloud API"

    def __init__(self) -> None:
        super().__init__()
        self.numbers: dict[str, Number] = {}
        self.limits = Limits()
        self.last_inbound: dict[tuple[str, str], float] = {}
        self.deliveries: list[Delivery] = []
        self.webhook_timeout_s = WEBHOOK_TIMEOUT_S

    # -- the business numbers and what they sent ----------------------------------------

    def add_number(
        self, phone_number_id: str | None = None, display: str = "15550783881"
    ) -> Number:
        """A business phone number with its own access token (kept if it exists)."""
        pnid = phone_number_id or str(secrets.randbelow(9 * 10**14) + 10**14)
        token = "EAAG" + secrets.token_urlsafe(48).replace("-", "x").replace("_", "y")
        waba = str(secrets.randbelow(9 * 10**14) + 10**14)
        return self.numbers.setdefault(pnid, Number(pnid, display, token, waba))

    def sent(self, phone_number_id: str, to: str | None = None) -> list[Json]:
        """Messages accepted from this number (to one wa_id): id, to, type, text, request."""
        return [m for m in self.numbers[phone_number_id].sent if to in (None, m["to"])]

    def open_window(self, phone_number_id: str, wa_id: str, at: float | None = None) -> None:
        """The customer wrote at `at` (default now) without a notification being posted."""
        self.last_inbound[(phone_number_id, wa_id)] = self.now() if at is None else at

    def fail_next(self, phone_number_id: str, k: int, error: GraphError) -> None:
        """The next k sends from this number answer this error (and send nothing)."""
        faults = [Fault("error", error.status, error.body()) for _ in range(k)]
        self.inject(phone_number_id, *faults)

    def hang_next(self, phone_number_id: str, k: int = 1, *, applied: bool = True) -> None:
        """The next k sends never answer (closed at `release_hangs` or stop)."""
        self.inject(phone_number_id, *[Fault("hang", applied=applied) for _ in range(k)])

    def cut_next(self, phone_number_id: str, k: int = 1, *, applied: bool = True) -> None:
        """The next k sends break off mid-answer: the caller cannot know the outcome."""
        self.inject(phone_number_id, *[Fault("cut", applied=applied) for _ in range(k)])

    # -- Meta calling our webhook ---------------------------------------------------------

    async def verify(self, url: str, verify_token: str, *, mode: str = "subscribe") -> Verification:
        """The subscription check: GET with hub.mode, hub.verify_token and hub.challenge."""
        challenge = str(secrets.randbelow(9 * 10**9) + 10**9)
        query = {"hub.mode": mode, "hub.verify_token": verify_token, "hub.challenge": challenge}
        async with httpx.AsyncClient(timeout=self.webhook_timeout_s, trust_env=False) as client:
            answer = await client.get(url, params=query)
        return Verification(answer.status_code, answer.text, challenge)

    async def customer_message(
        self, url: str, app_secret: str, phone_number_id: str, wa_id: str, text: str, *,
        name: str = "Ada Lovelace", wamid: str | None = None, reply_to: str | None = None,
    ) -> Delivery:  # fmt: skip
        """The customer writes: opens the 24 h window and posts the `messages` notification."""
        number = self.add_number(phone_number_id)
        self.open_window(phone_number_id, wa_id)
        message: Json = {"from": wa_id, "id": wamid or new_wamid(wa_id),
                         "timestamp": str(int(self.now())), "type": "text", "text": {"body": text}}  # fmt: skip
        if reply_to is not None:
            message["context"] = {"from": number.display_phone_number, "id": reply_to}
        contacts = [{"profile": {"name": name}, "wa_id": wa_id}]
        return await self._notify(
            url, app_secret, number, {"contacts": contacts, "messages": [message]}
        )

    async def status(
        self, url: str, app_secret: str, phone_number_id: str, wamid: str, status: str, *,
        wa_id: str | None = None, error_code: int | None = None,
    ) -> Delivery:  # fmt: skip
        """Post a `statuses` notification (sent, delivered, read or failed) for a message."""
        number = self.add_number(phone_number_id)
        known = [m for m in number.sent if m["id"] == wamid]
        recipient = wa_id or (known[0]["to"] if known else "")
        entry: Json = {"id": wamid, "status": status, "timestamp": str(int(self.now())),
                       "recipient_id": recipient}  # fmt: skip
        if status in ("sent", "delivered"):
            entry["conversation"] = {"id": hashlib.sha256(recipient.encode()).hexdigest()[:32],
                                     "origin": {"type": "service"}}  # fmt: skip
            entry["pricing"] = {"billable": True, "pricing_model": "PMP", "category": "service"}
        if status == "failed":
            title, details = TITLES.get(error_code or 131026, ("Unknown error", "Unknown error"))
            entry["errors"] = [{"code": error_code or 131026, "title": title, "message": title,
                                "error_data": {"details": details}, "href": ERROR_HREF}]  # fmt: skip
        return await self._notify(url, app_secret, number, {"statuses": [entry]})

    def undelivered(self) -> list[Delivery]:
        """Notifications whose last attempt was not answered 2xx."""
        return [d for d in self.deliveries if not d.delivered]

    async def redeliver(self, delivery: Delivery | None = None) -> list[Delivery]:
        """Post again, byte for byte, one notification or every undelivered one (Meta's retry)."""
        again = [delivery] if delivery is not None else self.undelivered()
        for each in again:
            await self._post(each)
        return again

    async def _notify(self, url: str, app_secret: str, number: Number, value: Json) -> Delivery:
        metadata = {"display_phone_number": number.display_phone_number,
                    "phone_number_id": number.phone_number_id}  # fmt: skip
        change = {"value": {"messaging_product": "whatsapp", "metadata": metadata, **value},
                  "field": "messages"}  # fmt: skip
        payload = {"object": "whatsapp_business_account",
                   "entry": [{"id": number.waba_id, "changes": [change]}]}  # fmt: skip
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "facebookexternalua",
                   "X-Hub-Signature-256": "sha256=" + sign(app_secret, body),
                   "X-Hub-Signature": "sha1=" + hmac.new(app_secret.encode(), body, "sha1").hexdigest()}  # fmt: skip
        delivery = Delivery(url, body, headers)
        self.deliveries.append(delivery)
        await self._post(delivery)
        return delivery

    async def _post(self, delivery: Delivery) -> None:
        try:
            async with httpx.AsyncClient(timeout=self.webhook_timeout_s, trust_env=False) as client:
                answer = await client.post(
                    delivery.url, content=delivery.body, headers=delivery.headers
                )
            delivery.attempts.append(answer.status_code)
            delivery.retry_after = answer.headers.get("retry-after")
        except httpx.HTTPError:
            delivery.attempts.append(0)

    # -- the messages endpoint ------------------------------------------------------------

    def routes(self) -> list[Route]:
        return [
            Route("/{version}/{phone_number_id}/messages", self._messages, methods=["POST"]),
            Route("/{path:path}", self._unknown, methods=["GET", "POST", "DELETE"]),
        ]

    async def _unknown(self, request: Request) -> Response:
        error = GraphError(2500, f"Unknown path components: {request.url.path}")
        return JSONResponse(error.body(), 400)

    async def _messages(self, request: Request) -> Response:
        pnid = request.path_params["phone_number_id"]
        try:
            number = self._authorized(request, pnid)
        except GraphError as exc:
            return JSONResponse(exc.body(), exc.status)

        async def run() -> Response:
            try:
                return JSONResponse(self._send(number, await _json(request)))
            except GraphError as exc:
                return JSONResponse(exc.body(), exc.status)

        return await self.answer(pnid, run)

    def _authorized(self, request: Request, pnid: str) -> Number:
        if not VERSION.match(request.path_params["version"]):
            raise GraphError(2500, f"Unknown path components: {request.url.path}")
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ").strip() or request.query_params.get("access_token")
        if not token:
            raise GraphError(104, "An access token is required to request this resource.")
        if token not in {n.token for n in self.numbers.values()}:
            raise GraphError(
                190, "Invalid OAuth access token - Cannot parse access token", status=401
            )
        number = self.numbers.get(pnid)
        if number is None or number.token != token:
            raise GraphError(100, f"Unsupported post request. Object with ID '{pnid}' does not "
                             "exist, cannot be loaded due to missing permissions, or does not "
                             "support this operation.", subcode=33, kind="GraphMethodException")  # fmt: skip
        return number

    def _send(self, number: Number, body: Json) -> Json:
        to, kind = _validate(body)
        wa_id = re.sub(r"\D", "", to)
        opened = self.last_inbound.get((number.phone_number_id, wa_id))
        if kind != "template" and (opened is None or self.now() - opened > WINDOW_S):
            raise titled(131047)
        now = self.now()
        if number.windows.wait("number", self.limits.throughput, now) > 0:
            raise titled(130429)
        if number.windows.wait(wa_id, self.limits.pair, now) > 0:
            raise titled(131056)
        number.windows.take(["number", wa_id], now)
        wamid = new_wamid(wa_id)
        text = body.get("text", {}).get("body") if kind == "text" else None
        context = (body.get("context") or {}).get("message_id")
        number.sent.append({"id": wamid, "to": wa_id, "type": kind, "text": text,
                            "context": context, "request": body, "at": now})  # fmt: skip
        answer: Json = {"id": wamid} | (
            {"message_status": "accepted"} if kind == "template" else {}
        )
        return {"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": wa_id}],
                "messages": [answer]}  # fmt: skip


async def _json(request: Request) -> Json:
    try:
        body = json.loads(await request.body())
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise invalid("Invalid parameter")
    return body


def _validate(body: Json) -> tuple[str, str]:
    """(to, type) of a valid send request; the Graph error Meta answers otherwise."""
    if body.get("messaging_product") != "whatsapp":
        raise invalid("The parameter messaging_product is required.")
    if body.get("recipient_type", "individual") not in ("individual", "group"):
        raise invalid("Param recipient_type must be one of {INDIVIDUAL, GROUP}")
    to, kind = body.get("to"), body.get("type", "text")
    if not isinstance(to, str) or not re.sub(r"\D", "", to):
        raise invalid("The parameter to is required.")
    if kind not in TYPES:
        raise invalid(f"Param type must be one of {{{', '.join(sorted(TYPES)).upper()}}}")
    if kind == "text":
        text = body.get("text")
        if not isinstance(text, dict) or not isinstance(text.get("body"), str) or not text["body"]:
            raise invalid("The parameter text['body'] is required.")
        if len(text["body"]) > MAX_BODY:
            raise invalid(f"Param text['body'] must be at most {MAX_BODY} characters long.")
    if kind == "template":
        template = body.get("template")
        if not isinstance(template, dict) or not isinstance(template.get("name"), str):
            raise invalid("The parameter template['name'] is required.")
        language = template.get("language")
        if not isinstance(language, dict) or not isinstance(language.get("code"), str):
            raise invalid("The parameter template['language']['code'] is required.")
    context = body.get("context")
    if context is not None and not (
        isinstance(context, dict) and isinstance(context.get("message_id"), str)
    ):
        raise invalid("Param context['message_id'] must be a valid message id")
    return to, str(kind)


def new_wamid(wa_id: str) -> str:
    """A message id shaped like Meta's: base64 of the customer's number and a random part."""
    digits = wa_id.encode()[:64]
    raw = b"\x1c\x18" + bytes([len(digits)]) + digits + b"\x15\x02\x00\x12\x18\x14"
    return (
        "wamid." + base64.b64encode(raw + secrets.token_hex(10).upper().encode() + b"\x00").decode()
    )


def sign(app_secret: str, body: bytes) -> str:
    """The hex HMAC-SHA256 Meta puts after `sha256=` in X-Hub-Signature-256."""
    return hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
