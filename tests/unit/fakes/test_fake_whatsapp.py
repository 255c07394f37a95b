"""The WhatsApp fake against real HTTP: the messages endpoint and its Graph errors, the 24 h
window and rate limits on the fake's clock, faults, and the webhook side posted to a loopback
receiver that checks the signature as our endpoint must."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fake_server import LoopbackFake
from fake_whatsapp import FakeWhatsApp, GraphError, Limits, Number
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

APP_SECRET = "app-secret-0123456789abcdef"
VERIFY_TOKEN = "verify-me-42"
CUSTOMER = "16505551234"


class Receiver(LoopbackFake):
    """Our side of the webhook, as small as it can be: the challenge and a checked signature."""

    what = "the test's webhook receiver"

    def __init__(self) -> None:
        super().__init__()
        self.received: list[dict[str, Any]] = []
        self.refuse = 0  # answer 500 to this many signed notifications

    @property
    def url(self) -> str:
        return f"{self.base_url}/hooks/whatsapp"

    def routes(self) -> list[Route]:
        return [Route("/hooks/whatsapp", self._hook, methods=["GET", "POST"])]

    async def _hook(self, request: Request) -> Response:
        if request.method == "GET":
            q = request.query_params
            if q.get("hub.mode") == "subscribe" and q.get("hub.verify_token") == VERIFY_TOKEN:
                return PlainTextResponse(q.get("hub.challenge", ""))
            return PlainTextResponse("forbidden", 403)
        raw = await request.body()
        expected = "sha256=" + hmac.new(APP_SECRET.encode(), raw, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, request.headers.get("x-hub-signature-256", "")):
            return PlainTextResponse("bad signature", 401)
        if self.refuse > 0:
            self.refuse -= 1
            return PlainTextResponse("try later", 500)
        self.received.append(json.loads(raw))
        return PlainTextResponse("ok")


@pytest.fixture(scope="module")
async def servers() -> AsyncIterator[tuple[FakeWhatsApp, Receiver]]:
    fake, receiver = FakeWhatsApp(), Receiver()
    await fake.start()
    await receiver.start()
    yield fake, receiver
    await receiver.stop()
    await fake.stop()


@pytest.fixture
def fake(servers: tuple[FakeWhatsApp, Receiver]) -> FakeWhatsApp:
    servers[0].limits = Limits()
    servers[0].deliveries.clear()
    return servers[0]


@pytest.fixture
def receiver(servers: tuple[FakeWhatsApp, Receiver]) -> Receiver:
    servers[1].received.clear()
    servers[1].refuse = 0
    return servers[1]


@pytest.fixture
def number(fake: FakeWhatsApp) -> Number:
    """A fresh business number per test: its own sends, windows and faults."""
    return fake.add_number()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
        yield client


def text(body: str, to: str = CUSTOMER, **extra: Any) -> dict[str, Any]:
    return {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to,
            "type": "text", "text": {"body": body}, **extra}  # fmt: skip


async def send(
    http: httpx.AsyncClient, fake: FakeWhatsApp, number: Number, body: Any, token: str | None = None
) -> tuple[int, dict[str, Any]]:
    answer = await http.post(
        f"{fake.base_url}/v21.0/{number.phone_number_id}/messages",
        json=body,
        headers={"Authorization": f"Bearer {token or number.token}"},
    )
    return answer.status_code, answer.json()


async def test_the_verification_get_returns_what_came_back(
    fake: FakeWhatsApp, receiver: Receiver
) -> None:
    good = await fake.verify(receiver.url, VERIFY_TOKEN)
    assert good.ok and good.body == good.challenge
    bad = await fake.verify(receiver.url, "guessed")
    assert (bad.ok, bad.status) == (False, 403)


async def test_a_customer_message_is_signed_and_shaped_like_meta_s(
    fake: FakeWhatsApp, receiver: Receiver, number: Number
) -> None:
    delivery = await fake.customer_message(
        receiver.url, APP_SECRET, number.phone_number_id, CUSTOMER, "Does it come in blue?"
    )
    assert delivery.delivered and receiver.received == [delivery.payload]
    assert delivery.payload["object"] == "whatsapp_business_account"
    value = delivery.payload["entry"][0]["changes"][0]["value"]
    assert value["metadata"]["phone_number_id"] == number.phone_number_id
    assert value["contacts"] == [{"profile": {"name": "Ada Lovelace"}, "wa_id": CUSTOMER}]
    message = value["messages"][0]
    assert message["from"] == CUSTOMER and message["id"].startswith("wamid.")
    assert message["type"] == "text" and message["text"] == {"body": "Does it come in blue?"}
    assert int(message["timestamp"]) == pytest.approx(fake.now(), abs=5)
    forged = await fake.customer_message(receiver.url, "not-the-secret", number.phone_number_id,
                                         CUSTOMER, "forged")  # fmt: skip
    assert forged.attempts == [401] and fake.undelivered() == [forged]


async def test_an_unanswered_notification_is_redelivered_byte_for_byte(
    fake: FakeWhatsApp, receiver: Receiver, number: Number
) -> None:
    receiver.refuse = 2
    delivery = await fake.customer_message(
        receiver.url, APP_SECRET, number.phone_number_id, CUSTOMER, "hello?"
    )
    assert not delivery.delivered and fake.undelivered() == [delivery]
    assert await fake.redeliver() == [delivery]
    assert not delivery.delivered
    await fake.redeliver()
    assert delivery.attempts == [500, 500, 200] and fake.undelivered() == []
    assert receiver.received == [delivery.payload]
    await fake.redeliver(delivery)
    assert receiver.received == [delivery.payload] * 2, "a duplicate, as Meta may send"


async def test_graph_errors_for_tokens_numbers_and_parameters(
    fake: FakeWhatsApp, number: Number, http: httpx.AsyncClient
) -> None:
    status, body = await send(http, fake, number, text("hi"), token="EAAGnotatoken")
    assert status == 401 and body["error"]["code"] == 190
    assert body["error"]["type"] == "OAuthException" and body["error"]["fbtrace_id"]
    other = fake.add_number()
    status, body = await send(http, fake, other, text("hi"), token=number.token)
    assert (status, body["error"]["code"], body["error"]["error_subcode"]) == (400, 100, 33)
    for request, details in [
        ({"to": CUSTOMER, "type": "text", "text": {"body": "x"}}, "messaging_product is required"),
        (text(""), "text['body'] is required"),
        (text("x" * 4097), "at most 4096 characters"),
        (text("x", type="telepathy"), "type must be one of"),
    ]:
        status, body = await send(http, fake, number, request)
        assert (status, body["error"]["code"]) == (400, 100)
        assert details in body["error"]["error_data"]["details"]
        assert body["error"]["error_data"]["messaging_product"] == "whatsapp"
    assert fake.sent(number.phone_number_id) == []


async def test_the_customer_service_window(
    fake: FakeWhatsApp, receiver: Receiver, number: Number, http: httpx.AsyncClient
) -> None:
    status, body = await send(http, fake, number, text("hello first"))
    assert (status, body["error"]["code"]) == (400, 131047)
    assert body["error"]["message"] == "(#131047) Re-engagement message"
    template = {"messaging_product": "whatsapp", "to": CUSTOMER, "type": "template",
                "template": {"name": "reopen", "language": {"code": "en_US"}}}  # fmt: skip
    status, body = await send(http, fake, number, template)
    assert status == 200 and body["messages"][0]["message_status"] == "accepted"
    inbound = await fake.customer_message(receiver.url, APP_SECRET, number.phone_number_id,
                                          CUSTOMER, "hi")  # fmt: skip
    wamid = inbound.payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
    status, body = await send(
        http,
        fake,
        number,
        text("+1 650-555-1234", to="+1 650-555-1234", context={"message_id": wamid}),
    )
    assert status == 200
    assert body["contacts"] == [{"input": "+1 650-555-1234", "wa_id": CUSTOMER}]
    assert body["messaging_product"] == "whatsapp" and body["messages"][0]["id"].startswith(
        "wamid."
    )
    [sent] = fake.sent(number.phone_number_id, CUSTOMER)[1:]
    assert (sent["id"], sent["text"], sent["context"]) == (
        body["messages"][0]["id"],
        "+1 650-555-1234",
        wamid,
    )
    fake.advance(24 * 3600 + 1)
    status, body = await send(http, fake, number, text("too late"))
    assert (status, body["error"]["code"]) == (400, 131047)


async def test_pair_rate_and_throughput_limits(
    fake: FakeWhatsApp, number: Number, http: httpx.AsyncClient
) -> None:
    fake.limits = Limits(pair=(2, 60.0))
    fake.open_window(number.phone_number_id, CUSTOMER)
    fake.open_window(number.phone_number_id, "447700900123")
    assert (await send(http, fake, number, text("1")))[0] == 200
    assert (await send(http, fake, number, text("2")))[0] == 200
    status, body = await send(http, fake, number, text("3"))
    assert (status, body["error"]["code"]) == (429, 131056)
    assert "pair rate limit hit" in body["error"]["message"]
    assert (await send(http, fake, number, text("1", to="447700900123")))[0] == 200
    fake.advance(60.0)
    assert (await send(http, fake, number, text("3")))[0] == 200
    fake.limits = Limits(throughput=(1, 1.0), pair=None)
    fake.advance(1.0)
    assert (await send(http, fake, number, text("4")))[0] == 200
    status, body = await send(http, fake, number, text("5", to="447700900123"))
    assert (status, body["error"]["code"]) == (400, 130429)
    assert [m["text"] for m in fake.sent(number.phone_number_id, CUSTOMER)] == ["1", "2", "3", "4"]


async def test_status_notifications_name_the_message_and_its_customer(
    fake: FakeWhatsApp, receiver: Receiver, number: Number, http: httpx.AsyncClient
) -> None:
    fake.open_window(number.phone_number_id, CUSTOMER)
    _, body = await send(http, fake, number, text("your order shipped"))
    wamid = body["messages"][0]["id"]
    for state in ("sent", "delivered", "read"):
        await fake.status(receiver.url, APP_SECRET, number.phone_number_id, wamid, state)
    failed = await fake.status(receiver.url, APP_SECRET, number.phone_number_id, wamid, "failed",
                               error_code=131047)  # fmt: skip
    statuses = [r["entry"][0]["changes"][0]["value"]["statuses"][0] for r in receiver.received]
    assert [(s["id"], s["status"], s["recipient_id"]) for s in statuses] == [
        (wamid, state, CUSTOMER) for state in ("sent", "delivered", "read", "failed")
    ]
    assert statuses[1]["pricing"]["category"] == "service" and "pricing" not in statuses[2]
    assert failed.delivered and statuses[3]["errors"][0]["code"] == 131047


async def test_faults_fail_cut_and_hang(
    fake: FakeWhatsApp, number: Number, http: httpx.AsyncClient
) -> None:
    fake.open_window(number.phone_number_id, CUSTOMER)
    fake.limits = Limits(pair=None)
    fake.fail_next(number.phone_number_id, 1, GraphError(2, "(#2) Service temporarily unavailable",
                                                         status=503))  # fmt: skip
    status, body = await send(http, fake, number, text("x"))
    assert (status, body["error"]["code"]) == (503, 2)
    fake.cut_next(number.phone_number_id)
    with pytest.raises(httpx.RemoteProtocolError):
        await send(http, fake, number, text("cut"))
    fake.hang_next(number.phone_number_id, applied=False)
    with pytest.raises(httpx.ReadTimeout):
        await http.post(f"{fake.base_url}/v21.0/{number.phone_number_id}/messages", json=text("h"),
                        headers={"Authorization": f"Bearer {number.token}"}, timeout=0.5)  # fmt: skip
    fake.release_hangs()
    assert (await send(http, fake, number, text("ok")))[0] == 200
    assert [m["text"] for m in fake.sent(number.phone_number_id)] == ["cut", "ok"]
