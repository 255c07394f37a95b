"""The Discord fake itself: signed interactions, follow-ups, nonce dedupe, errors and 429s,
faults, and the gateway's IDENTIFY / READY / MESSAGE_CREATE / RESUME / close codes, driven by
a real HTTP endpoint of ours and the `websockets` client."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from fake_discord import (
    CHANNEL_ID,
    TOKEN,
    FakeDiscord,
    Fault,
)
from fake_discord_gateway import GUILD_MESSAGES, MESSAGE_CONTENT
from fake_discord_interactions import FAILED
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from eventos.testing import wait_for

BOT = {"Authorization": f"Bot {TOKEN}"}
INTENTS = GUILD_MESSAGES | MESSAGE_CONTENT
IDENTIFY = {"token": TOKEN, "intents": INTENTS, "properties": {"os": "linux", "browser": "t", "device": "t"}}  # fmt: skip


@dataclass
class Endpoint:
    """Our side of interactions: verifies the signature with nacl, answers PONG or a defer."""

    public_key: str
    seen: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    hold: asyncio.Event = field(default_factory=asyncio.Event)
    hang: bool = False
    url: str = ""

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        self.seen.append((dict(request.headers), body))
        try:
            stamp = request.headers["x-signature-timestamp"]
            signature = bytes.fromhex(request.headers["x-signature-ed25519"])
            VerifyKey(bytes.fromhex(self.public_key)).verify(stamp.encode() + body, signature)
        except (KeyError, ValueError, BadSignatureError):
            return Response("invalid request signature", 401)
        if self.hang:
            await asyncio.wait_for(self.hold.wait(), 30)
        kind = json.loads(body)["type"]
        return JSONResponse({"type": 1} if kind == 1 else {"type": 5})


@pytest.fixture(scope="module")
async def discord() -> AsyncIterator[FakeDiscord]:
    fake = FakeDiscord()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture(scope="module")
async def endpoint(discord: FakeDiscord) -> AsyncIterator[Endpoint]:
    ours = Endpoint(discord.public_key)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    ours.url = f"http://127.0.0.1:{sock.getsockname()[1]}/interactions"
    app = Starlette(routes=[Route("/interactions", ours.handle, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def started() -> bool:
        return server.started

    await wait_for(started, what="our interactions endpoint listens")
    yield ours
    ours.hold.set()
    server.should_exit = True
    await asyncio.wait_for(task, 10)


@pytest.fixture
async def api(discord: FakeDiscord) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=discord.api_url, timeout=10) as client:
        yield client


async def recv(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(5):
        payload: dict[str, Any] = json.loads(await ws.recv())
    return payload


async def closed_with(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(5):
            while True:
                await ws.recv()
    return ws.close_code


async def test_signature_verifies_with_nacl_and_tampering_is_refused(
    discord: FakeDiscord, endpoint: Endpoint
) -> None:
    reply = await discord.interact(endpoint.url, options={"question": "where is 7731?", "n": 2})
    assert (reply.status, reply.body, reply.failed) == (200, {"type": 5}, None)
    headers, body = endpoint.seen[-1]
    key = VerifyKey(bytes.fromhex(discord.public_key))
    stamp, signature = (
        headers["x-signature-timestamp"],
        bytes.fromhex(headers["x-signature-ed25519"]),
    )
    key.verify(stamp.encode() + body, signature)
    with pytest.raises(BadSignatureError):
        key.verify(stamp.encode() + body.replace(b"7731", b"7732"), signature)
    sent = json.loads(body)
    assert (
        sent["version"] == 1 and sent["member"]["user"]["id"] and sent["channel_id"] == CHANNEL_ID
    )
    assert sent["data"]["options"] == [
        {"name": "question", "type": 3, "value": "where is 7731?"},
        {"name": "n", "type": 4, "value": 2},
    ]
    for tamper in ("key", "body", "timestamp", "missing"):
        bad = await discord.interact_with_bad_signature(endpoint.url, tamper=tamper)
        assert bad.status == 401, tamper
    ping = await discord.interact(endpoint.url, type=1)
    assert (ping.body, ping.failed) == ({"type": 1}, None)


async def test_deferred_reply_then_follow_ups_are_counted(
    discord: FakeDiscord, endpoint: Endpoint, api: httpx.AsyncClient
) -> None:
    channel = discord.add_channel("1187000000000000201")
    reply = await discord.interact(endpoint.url, channel_id=channel.id)
    assert reply.failed is None and discord.messages(channel.id) == []  # still "thinking"
    hook = f"/webhooks/{discord.application_id}/{reply.interaction.token}"
    edited = await api.patch(f"{hook}/messages/@original", json={"content": "Your parcel left."})
    assert edited.status_code == 200 and edited.json()["content"] == "Your parcel left."
    follow = await api.post(hook, json={"content": "Anything else?"})
    assert follow.status_code == 200 and follow.json()["webhook_id"] == discord.application_id
    assert [m["content"] for m in discord.messages(channel.id)] == ["Your parcel left.", "Anything else?"]  # fmt: skip
    assert len(reply.interaction.followups) == 1
    unknown = await api.post(
        f"/webhooks/{discord.application_id}/not-a-token", json={"content": "x"}
    )
    assert (unknown.status_code, unknown.json()) == (404, {"message": "Unknown Webhook", "code": 10015})  # fmt: skip
    discord.advance(15 * 60 + 1)
    expired = await api.post(hook, json={"content": "too late"})
    assert expired.json()["code"] == 10015 and len(discord.messages(channel.id)) == 2


async def test_an_answer_after_3_seconds_fails_and_kills_the_token(
    discord: FakeDiscord, endpoint: Endpoint, api: httpx.AsyncClient
) -> None:
    endpoint.hang = True
    try:
        reply = await discord.interact(endpoint.url)
    finally:
        endpoint.hang = False
        endpoint.hold.set()
    assert (reply.status, reply.failed) == (None, FAILED)
    late = await api.post(f"/webhooks/{discord.application_id}/{reply.interaction.token}", json={"content": "x"})  # fmt: skip
    assert late.json()["code"] == 10015


async def test_enforced_nonce_returns_the_first_message(
    discord: FakeDiscord, api: httpx.AsyncClient
) -> None:
    channel = discord.add_channel("1187000000000000202")
    url = f"/channels/{channel.id}/messages"
    body = {"content": "hello", "nonce": "outbox-41", "enforce_nonce": True}
    first, again = await api.post(url, json=body, headers=BOT), await api.post(url, json=body, headers=BOT)  # fmt: skip
    assert first.status_code == again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["nonce"] == "outbox-41"
    assert len(discord.messages(channel.id)) == 1
    loose = {"content": "hello", "nonce": "outbox-41"}  # without enforce_nonce, a second message
    assert (await api.post(url, json=loose, headers=BOT)).json()["id"] != first.json()["id"]
    discord.advance(301)
    later = await api.post(url, json=body, headers=BOT)
    assert later.json()["id"] != first.json()["id"] and len(discord.messages(channel.id)) == 3


async def test_errors_have_discord_shapes(discord: FakeDiscord, api: httpx.AsyncClient) -> None:
    url = f"/channels/{CHANNEL_ID}/messages"
    denied = await api.post(url, json={"content": "x"}, headers={"Authorization": "Bot nope"})
    assert (denied.status_code, denied.json()) == (401, {"message": "401: Unauthorized", "code": 0})
    unknown = await api.post("/channels/42/messages", json={"content": "x"}, headers=BOT)
    assert (unknown.status_code, unknown.json()["code"]) == (404, 10003)
    discord.add_channel("1187000000000000203", can_send=False)
    locked = await api.post("/channels/1187000000000000203/messages", json={"content": "x"}, headers=BOT)  # fmt: skip
    assert (locked.status_code, locked.json()) == (
        403,
        {"message": "Missing Access", "code": 50001},
    )
    long = await api.post(url, json={"content": "x" * 2001}, headers=BOT)
    assert long.status_code == 400 and long.json()["code"] == 50035
    assert long.json()["errors"]["content"]["_errors"][0]["code"] == "BASE_TYPE_MAX_LENGTH"
    empty = await api.post(url, json={"content": ""}, headers=BOT)
    assert empty.json()["code"] == 50006
    nowhere = await api.get("/users/@me/nothing", headers=BOT)
    assert (nowhere.status_code, nowhere.json()) == (404, {"message": "404: Not Found", "code": 0})


async def test_rate_limits_answer_429_with_discord_body_and_headers(
    discord: FakeDiscord, api: httpx.AsyncClient
) -> None:
    other_channel = discord.add_channel("1187000000000000205")
    discord.set_limit("messages", 2, 60.0)
    try:
        url = f"/channels/{CHANNEL_ID}/messages"
        ok = [await api.post(url, json={"content": f"m{i}"}, headers=BOT) for i in range(2)]
        assert ok[0].headers["x-ratelimit-remaining"] == "1" and ok[1].status_code == 200
        limited = await api.post(url, json={"content": "m2"}, headers=BOT)
        body = limited.json()
        assert limited.status_code == 429 and set(body) == {"message", "retry_after", "global"}
        assert isinstance(body["retry_after"], float) and 0 < body["retry_after"] <= 60
        assert (
            body["global"] is False and int(limited.headers["retry-after"]) >= body["retry_after"]
        )
        for name in ("limit", "remaining", "reset", "reset-after", "bucket"):
            assert f"x-ratelimit-{name}" in limited.headers
        other = await api.post(f"/channels/{other_channel.id}/messages", json={"content": "x"}, headers=BOT)  # fmt: skip
        assert other.status_code == 200  # buckets are per channel
    finally:
        discord.set_limit("messages", 5, 5.0)
    discord.set_limit("global", 1, 60.0)
    try:
        await api.get("/gateway/bot", headers=BOT)
        limited = await api.get("/gateway/bot", headers=BOT)
        assert limited.status_code == 429 and limited.json()["global"] is True
        assert limited.headers["x-ratelimit-global"] == "true"
    finally:
        discord.set_limit("global", 50, 1.0)


async def test_faults_fail_hang_and_cut(discord: FakeDiscord, api: httpx.AsyncClient) -> None:
    channel = discord.add_channel("1187000000000000204")
    url = f"/channels/{channel.id}/messages"
    discord.fail_next(1, Fault(status=502, message="502: Bad Gateway", route="messages"))
    assert (await api.post(url, json={"content": "a"}, headers=BOT)).status_code == 502
    assert discord.messages(channel.id) == []
    discord.fail_next(1, Fault(cut=True, deliver=True))
    with pytest.raises(httpx.RemoteProtocolError):
        await api.post(url, json={"content": "b", "nonce": "n-b", "enforce_nonce": True}, headers=BOT)  # fmt: skip
    assert [m["content"] for m in discord.messages(channel.id)] == ["b"]  # arrived, answer lost
    retry = await api.post(url, json={"content": "b", "nonce": "n-b", "enforce_nonce": True}, headers=BOT)  # fmt: skip
    assert retry.status_code == 200 and len(discord.messages(channel.id)) == 1
    discord.fail_next(1, Fault(status=200, hang=True, deliver=True))
    pending = asyncio.create_task(api.post(url, json={"content": "c"}, headers=BOT))

    async def arrived() -> bool:
        return len(discord.messages(channel.id)) == 2

    await wait_for(arrived, what="the hung message arrived")
    assert not pending.done()
    discord.release()
    assert (await asyncio.wait_for(pending, 10)).json()["content"] == "c"


async def test_gateway_identify_message_drop_resume_replays_once(
    discord: FakeDiscord, api: httpx.AsyncClient
) -> None:
    gateway = (await api.get("/gateway/bot", headers=BOT)).json()
    async with connect(f"{gateway['url']}/?v=10&encoding=json") as ws:
        hello = await recv(ws)
        assert hello["op"] == 10 and hello["d"]["heartbeat_interval"] > 0
        await ws.send(json.dumps({"op": 2, "d": IDENTIFY}))
        ready = await recv(ws)
        assert (ready["op"], ready["t"], ready["s"]) == (0, "READY", 1)
        session_id, resume_url = ready["d"]["session_id"], ready["d"]["resume_gateway_url"]
        await discord.post_channel_message(CHANNEL_ID, "1187000000000000301", "first")
        created = await recv(ws)
        assert (created["t"], created["s"], created["d"]["content"]) == ("MESSAGE_CREATE", 2, "first")  # fmt: skip
        assert created["d"]["guild_id"] and created["d"]["author"]["id"] == "1187000000000000301"
        await ws.send(json.dumps({"op": 1, "d": 2}))
        assert (await recv(ws))["op"] == 11
        await discord.gateway.drop_connection()
        assert await closed_with(ws) == 4000
    await discord.post_channel_message(CHANNEL_ID, "1187000000000000301", "missed")
    async with connect(f"{resume_url}?v=10&encoding=json") as ws:
        assert (await recv(ws))["op"] == 10
        await ws.send(json.dumps({"op": 6, "d": {"token": TOKEN, "session_id": session_id, "seq": 2}}))  # fmt: skip
        replayed, resumed = await recv(ws), await recv(ws)
        assert (replayed["t"], replayed["s"], replayed["d"]["content"]) == ("MESSAGE_CREATE", 3, "missed")  # fmt: skip
        assert resumed["t"] == "RESUMED"
        await discord.post_channel_message(CHANNEL_ID, "1187000000000000301", "after")
        after = await recv(ws)
        assert (after["d"]["content"], after["s"]) == (
            "after",
            resumed["s"] + 1,
        )  # missed came once
    assert discord.gateway.paths[-1].startswith("/resume")


async def test_gateway_refuses_with_discord_codes(discord: FakeDiscord) -> None:
    async def opened() -> ClientConnection:
        ws = await connect(f"{discord.gateway.url}/?v=10&encoding=json")
        assert (await recv(ws))["op"] == 10
        return ws

    ws = await opened()
    await ws.send(json.dumps({"op": 6, "d": {"token": TOKEN, "session_id": "nope", "seq": 1}}))
    assert await recv(ws) == {"op": 9, "d": False, "s": None, "t": None}
    await ws.close()
    ws = await opened()
    await ws.send(json.dumps({"op": 2, "d": {**IDENTIFY, "token": "wrong"}}))
    assert await closed_with(ws) == 4004
    ws = await opened()
    await ws.send(json.dumps({"op": 2, "d": {**IDENTIFY, "intents": GUILD_MESSAGES}}))
    session_id = (await recv(ws))["d"]["session_id"]
    await discord.post_channel_message(CHANNEL_ID, "1187000000000000301", "secret")
    assert (await recv(ws))["d"]["content"] == ""  # no MESSAGE_CONTENT intent
    await discord.gateway.drop_connection(code=None)
    ws = await opened()
    await ws.send(json.dumps({"op": 6, "d": {"token": TOKEN, "session_id": session_id, "seq": 99}}))  # fmt: skip
    assert await closed_with(ws) == 4007
    await discord.gateway.expire_sessions()
    ws = await opened()
    await ws.send(json.dumps({"op": 6, "d": {"token": TOKEN, "session_id": session_id, "seq": 1}}))  # fmt: skip
    assert (await recv(ws))["op"] == 9
    await ws.send(json.dumps({"op": 2, "d": IDENTIFY}))  # a fresh session on the same socket
    ended = (await recv(ws))["d"]["session_id"]
    await ws.close(1000)  # closing with 1000 ends the session: no RESUME after it

    async def let_go() -> bool:
        return discord.gateway.sessions[ended].conn is None

    await wait_for(let_go, what="the fake saw the close")
    ws = await opened()
    await ws.send(json.dumps({"op": 6, "d": {"token": TOKEN, "session_id": ended, "seq": 1}}))
    assert (await recv(ws))["op"] == 9
    await ws.close()
    discord.gateway.heartbeat_interval_ms = 200
    try:
        ws = await opened()
        assert await closed_with(ws) == 4009  # no heartbeat in time
    finally:
        discord.gateway.heartbeat_interval_ms = 41_250
