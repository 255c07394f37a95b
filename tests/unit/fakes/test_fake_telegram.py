"""The Telegram fake against real HTTP: offsets, long polls, conflicts, limits, errors, faults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fake_telegram import FakeTelegram, Limits

from eventos.testing import wait_for

CHAT = 4_100_200_300


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[FakeTelegram]:
    fake = FakeTelegram()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def fake(server: FakeTelegram) -> FakeTelegram:
    server.limits = Limits()
    return server


@pytest.fixture
def token(fake: FakeTelegram) -> str:
    """A fresh bot per test, so queues and windows start empty."""
    return fake.add_bot()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
        yield client


async def call(
    http: httpx.AsyncClient, fake: FakeTelegram, token: str, method: str, **params: Any
) -> tuple[int, dict[str, Any]]:
    answer = await http.post(f"{fake.base_url}/bot{token}/{method}", json=params)
    return answer.status_code, answer.json()


async def test_get_me_and_the_ways_a_call_is_refused(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    status, body = await call(http, fake, token, "getMe")
    assert status == 200 and body["ok"] and body["result"]["is_bot"]
    assert body["result"]["id"] == int(token.split(":")[0])
    assert await call(http, fake, "1:wrong", "getMe") == (
        401, {"ok": False, "error_code": 401, "description": "Unauthorized"})  # fmt: skip
    status, body = await call(http, fake, token, "noSuchMethod")
    assert (status, body["description"]) == (404, "Not Found")
    status, body = await call(http, fake, token, "sendMessage", chat_id=CHAT, text="hi")
    assert (status, body["description"]) == (400, "Bad Request: chat not found")


async def test_get_query_and_form_bodies_are_read_like_json(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    fake.customer_message(token, CHAT, "hello")
    url = f"{fake.base_url}/bot{token}"
    answer = await http.get(f"{url}/getupdates", params={"limit": "1"})
    assert [u["message"]["text"] for u in answer.json()["result"]] == ["hello"]
    reply = json.dumps({"message_id": 1})
    answer = await http.post(
        f"{url}/sendMessage", data={"chat_id": str(CHAT), "text": "yes", "reply_parameters": reply}
    )
    assert answer.json()["result"]["reply_to_message"]["message_id"] == 1
    fake.advance(1.0)
    files = {"text": (None, "multi")}
    answer = await http.post(f"{url}/sendMessage", data={"chat_id": str(CHAT)}, files=files)
    assert answer.json()["result"]["text"] == "multi"
    assert [m["text"] for m in fake.sent(token, CHAT)] == ["yes", "multi"]


async def test_an_offset_confirms_every_update_below_it(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    first, second, third = (fake.customer_message(token, CHAT, t) for t in ("a", "b", "c"))
    assert second["update_id"] == first["update_id"] + 1
    assert second["message"]["message_id"] == first["message"]["message_id"] + 1
    _, body = await call(http, fake, token, "getUpdates", limit=2)
    assert [u["update_id"] for u in body["result"]] == [first["update_id"], second["update_id"]]
    assert len(fake.pending(token)) == 3, "reading confirms nothing"
    _, body = await call(http, fake, token, "getUpdates", offset=second["update_id"])
    assert [u["update_id"] for u in body["result"]] == [second["update_id"], third["update_id"]]
    assert fake.confirmed_offset(token) == second["update_id"]
    await call(http, fake, token, "getUpdates", offset=third["update_id"] + 1)
    assert fake.pending(token) == [] and fake.confirmed_offset(token) == third["update_id"] + 1


async def test_a_negative_offset_keeps_only_the_last_updates(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    updates = [fake.customer_message(token, CHAT, str(i)) for i in range(5)]
    _, body = await call(http, fake, token, "getUpdates", offset=-2)
    assert body["result"] == updates[3:]
    assert fake.pending(token) == updates[3:]


async def test_a_long_poll_returns_as_soon_as_an_update_arrives(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    poll = asyncio.create_task(call(http, fake, token, "getUpdates", timeout=30))
    await wait_for(lambda: _async(len(fake.calls(token, "getUpdates")) == 1), what="poll arrived")
    await asyncio.sleep(0)
    assert not poll.done()
    update = fake.customer_message(token, -1001234567890, "hi all", chat_type="supergroup")
    status, body = await asyncio.wait_for(poll, 10)
    assert status == 200 and body["result"] == [update]
    assert update["message"]["chat"] == {
        "id": -1001234567890,
        "title": "Customers",
        "type": "supergroup",
    }
    _, body = await call(http, fake, token, "getUpdates", timeout=0, offset=update["update_id"] + 1)
    assert body["result"] == []


async def test_a_second_poller_ends_the_first_with_409(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    first = asyncio.create_task(call(http, fake, token, "getUpdates", timeout=30))
    await wait_for(lambda: _async(len(fake.calls(token, "getUpdates")) == 1), what="poll arrived")
    second = asyncio.create_task(call(http, fake, token, "getUpdates", timeout=30))
    status, body = await asyncio.wait_for(first, 10)
    assert status == 409
    assert body["description"].startswith("Conflict: terminated by other getUpdates request")
    fake.customer_message(token, CHAT, "to the survivor")
    status, body = await asyncio.wait_for(second, 10)
    assert status == 200 and body["result"][0]["message"]["text"] == "to the survivor"


async def test_no_get_updates_while_a_webhook_is_set(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    assert (await call(http, fake, token, "setWebhook", url="https://hooks.example/tg"))[0] == 200
    status, body = await call(http, fake, token, "getUpdates")
    assert status == 409 and "webhook is active" in body["description"]
    assert (await call(http, fake, token, "deleteWebhook"))[0] == 200
    assert (await call(http, fake, token, "getUpdates"))[0] == 200


async def test_updates_older_than_a_day_are_dropped(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    fake.customer_message(token, CHAT, "old")
    fake.advance(25 * 3600)
    fresh = fake.customer_message(token, CHAT, "new")
    _, body = await call(http, fake, token, "getUpdates")
    assert body["result"] == [fresh]


async def test_send_message_checks_the_text(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    fake.limits = Limits(private=None, bot=None)
    fake.add_chat(token, CHAT)
    for text, mode, description in [
        ("", None, "Bad Request: message text is empty"),
        ("<b> </b>", "HTML", "Bad Request: message text is empty"),
        ("x" * 4097, None, "Bad Request: message is too long"),
    ]:
        status, body = await call(
            http, fake, token, "sendMessage", chat_id=CHAT, text=text, parse_mode=mode
        )
        assert (status, body["description"]) == (400, description)
    status, body = await call(
        http,
        fake,
        token,
        "sendMessage",
        chat_id=CHAT,
        text=f"<b>{'x' * 4096}</b>",
        parse_mode="HTML",
    )
    assert status == 200 and body["result"]["text"] == "x" * 4096
    status, body = await call(
        http,
        fake,
        token,
        "sendMessage",
        chat_id=CHAT,
        text="re",
        reply_parameters={"message_id": 999},
    )
    assert (status, body["description"]) == (400, "Bad Request: message to be replied not found")
    assert len(fake.sent(token, CHAT)) == 1


async def test_blocked_and_migrated_chats(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    fake.add_chat(token, CHAT)
    fake.block(token, CHAT)
    status, body = await call(http, fake, token, "sendMessage", chat_id=CHAT, text="hi")
    assert (status, body["description"]) == (403, "Forbidden: bot was blocked by the user")
    fake.add_chat(token, -4001, chat_type="group")
    fake.migrate(token, -4001, -1009998887776)
    status, body = await call(http, fake, token, "sendMessage", chat_id=-4001, text="hi")
    assert status == 400 and body["parameters"] == {"migrate_to_chat_id": -1009998887776}
    assert (await call(http, fake, token, "sendMessage", chat_id=-1009998887776, text="hi"))[
        0
    ] == 200


async def test_rate_limits_answer_429_with_retry_after(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    fake.add_chat(token, CHAT)
    assert (await call(http, fake, token, "sendMessage", chat_id=CHAT, text="1"))[0] == 200
    status, body = await call(http, fake, token, "sendMessage", chat_id=CHAT, text="2")
    assert status == 429
    assert body == {"ok": False, "error_code": 429, "description": "Too Many Requests: retry after 1",
                    "parameters": {"retry_after": 1}}  # fmt: skip
    fake.advance(1.0)
    assert (await call(http, fake, token, "sendMessage", chat_id=CHAT, text="2"))[0] == 200
    fake.limits = Limits(group=(3, 60.0))
    fake.add_chat(token, -5001, chat_type="group")
    for text in "abc":
        assert (await call(http, fake, token, "sendMessage", chat_id=-5001, text=text))[0] == 200
    fake.advance(20.0)
    status, body = await call(http, fake, token, "sendMessage", chat_id=-5001, text="d")
    assert status == 429 and body["parameters"]["retry_after"] == 40
    assert [m["text"] for m in fake.sent(token, -5001)] == ["a", "b", "c"]


async def test_faults_fail_cut_and_hang(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    fake.limits = Limits(private=None)
    fake.add_chat(token, CHAT)
    fake.fail_next(token, 2, 502, "Bad Gateway")
    for _ in range(2):
        assert await call(http, fake, token, "sendMessage", chat_id=CHAT, text="x") == (
            502, {"ok": False, "error_code": 502, "description": "Bad Gateway"})  # fmt: skip
    fake.fail_next(token, 1, 502, raw=b"<html><body>502 Bad Gateway</body></html>")
    answer = await http.post(
        f"{fake.base_url}/bot{token}/sendMessage", json={"chat_id": CHAT, "text": "x"}
    )
    assert (answer.status_code, answer.headers["content-type"].split(";")[0]) == (502, "text/html")
    assert fake.sent(token) == []
    fake.cut_next(token)
    with pytest.raises(httpx.RemoteProtocolError):
        await call(http, fake, token, "sendMessage", chat_id=CHAT, text="cut")
    assert [m["text"] for m in fake.sent(token)] == ["cut"], "sent, though the caller cannot know"
    fake.hang_next(token, applied=False)
    with pytest.raises(httpx.ReadTimeout):
        await http.post(f"{fake.base_url}/bot{token}/sendMessage", json={"chat_id": CHAT, "text": "h"},
                        timeout=0.5)  # fmt: skip
    fake.release_hangs()
    assert [m["text"] for m in fake.sent(token)] == ["cut"]
    assert (await call(http, fake, token, "sendMessage", chat_id=CHAT, text="ok"))[0] == 200


async def test_a_held_confirming_call_can_be_dropped_or_let_through(
    fake: FakeTelegram, token: str, http: httpx.AsyncClient
) -> None:
    update = fake.customer_message(token, CHAT, "once")
    fake.hold(token)
    confirming = asyncio.create_task(
        call(http, fake, token, "getUpdates", offset=update["update_id"] + 1)
    )
    await wait_for(lambda: _async(fake.held(token)), what="the confirming call is parked")
    assert fake.held(token)[0]["offset"] == update["update_id"] + 1
    fake.release(token, drop=True)
    with pytest.raises(httpx.RemoteProtocolError):
        await asyncio.wait_for(confirming, 10)
    assert fake.pending(token) == [update], "a dropped call confirmed nothing"
    fake.hold(token)
    confirming = asyncio.create_task(
        call(http, fake, token, "getUpdates", offset=update["update_id"] + 1)
    )
    await wait_for(lambda: _async(fake.held(token)), what="the confirming call is parked")
    fake.release(token)
    assert (await asyncio.wait_for(confirming, 10))[1]["result"] == []
    assert fake.pending(token) == []


async def _async(value: Any) -> Any:
    return value


async def test_stop_answers_a_waiting_long_poll(http: httpx.AsyncClient) -> None:
    own = FakeTelegram()
    await own.start()
    token = own.add_bot()
    poll = asyncio.create_task(call(http, own, token, "getUpdates", timeout=50))
    await wait_for(lambda: _async(own.calls(token, "getUpdates")), what="the poll arrived")
    await own.stop()
    assert await asyncio.wait_for(poll, 10) == (200, {"ok": True, "result": []})
