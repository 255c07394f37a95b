"""Discord on the real stack (issue 14): the interactions endpoint and the gateway reader in
ingress against the Discord fake, turns on the dev server, the egress sender under SPEC §11."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from channel_stack import STOP_S, now, running_ingress
from conftest import ADMIN_TOKEN, SECRETS, apply_and_start, ingress_config
from fake_discord import CHANNEL_ID, TOKEN, USER_ID, FakeDiscord, Fault
from fake_discord_interactions import FAILED
from psycopg_pool import AsyncConnectionPool
from test_router import query
from test_turns import IDLE_S, PRICES, ROLL_AFTER, local_spec, pump

from eventos import names
from eventos.channels.discord import DiscordApi, DiscordSender, nonce, parse_credential, seal_token
from eventos.channels.senders import Deferred, Delivered, Outgoing, Refused, Unclear
from eventos.channels.settings import ChannelSettings
from eventos.control.intent_deliverer import Deliverer
from eventos.db import Conn
from eventos.db import connect as db_connect
from eventos.delivery.relay import Relay
from eventos.llm.activity import LlmActivities
from eventos.llm.endpoints import LlmEndpoints
from eventos.llm.worker import llm_worker
from eventos.outbox.egress import Egress, retry_loop
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.payload_guard import connect
from eventos.runtime.service import Service, cancel_and_wait
from eventos.runtime.temporal import TemporalConnection
from eventos.settings import DatabaseSettings, SecretStore, TemporalSettings, TurnTimeouts
from eventos.testing import wait_for
from eventos.workers.activities import DbActivities
from eventos.workers.roles import egress_worker, workflow_worker


def credential(fake: FakeDiscord) -> str:
    return json.dumps({"bot_token": TOKEN, "application_id": fake.application_id,
                       "public_key": fake.public_key, "api": fake.api_url})  # fmt: skip


@dataclass
class Stack:
    name: str
    fake: FakeDiscord
    pool: AsyncConnectionPool[Conn]
    api: httpx.AsyncClient
    db: DbActivities
    queue: str
    client: Any
    ingress_config: Any
    ingress: Service
    url: str  # our interactions endpoint for the account

    async def stop_ingress(self) -> None:
        """Stop the fixture's ingress (its readers let go of their gateway connections)."""
        self.ingress.stop()
        await wait_for(now(lambda: not self.fake.gateway.live_sessions()), timeout=STOP_S,
                       what="the reader's connection gone")  # fmt: skip

    @property
    def source(self) -> str:
        return f"discord:dc-{self.name}"

    async def inbox(self) -> list[dict[str, Any]]:
        return await query(self.pool, f"SELECT dedupe_key, envelope, status FROM bus_ingress "
                                      f"WHERE source_key = '{self.source}' ORDER BY id")  # fmt: skip

    async def outbox(self) -> list[dict[str, Any]]:
        sql = f"SELECT * FROM outbound_messages WHERE employee = '{self.name}' ORDER BY id"
        return await query(self.pool, sql)

    async def one_outbox(self, status: str) -> dict[str, Any]:
        async def settled() -> dict[str, Any] | None:
            rows = await self.outbox()
            return rows[0] if rows and rows[0]["status"] == status else None

        return await wait_for(settled, timeout=60, interval=0.1, what=f"an outbox row {status}")

    def bot_messages(self, channel_id: str = CHANNEL_ID) -> list[dict[str, Any]]:
        return [m for m in self.fake.messages(channel_id)
                if m["author"]["id"] == self.fake.application_id]  # fmt: skip

    def requests(self, route: str) -> list[Any]:
        return [r for r in self.fake.requests if f"/{route}/" in r.path]

    async def cursor(self) -> dict[str, Any]:
        rows = await query(self.pool, f"SELECT cursor FROM channel_accounts "
                                      f"WHERE id = '{self.source}'")  # fmt: skip
        return dict(rows[0]["cursor"] or {}) if rows else {}


@pytest.fixture
async def stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    fake = FakeDiscord()
    await fake.start()
    name = f"d{uuid.uuid4().hex[:8]}"
    wrong = json.dumps({**json.loads(credential(fake)), "bot_token": "not.the.token"})
    secrets = SecretStore(env={**SECRETS, f"EVENTOS_SECRET_DC_{name.upper()}": credential(fake),
                               f"EVENTOS_SECRET_DC_{name.upper()}_WRONG": wrong})  # fmt: skip
    # A lease outlives a commit stalled by a held lock (5 s statement timeout): no self-takeover.
    channels = ChannelSettings(refresh_s=1, lease_ttl_s=30, down_alert_s=1, send_timeout_s=5,
                               gateway_wait_s=1)  # fmt: skip
    cfg = ingress_config(db_settings, tmp_path, secrets=secrets, channels=channels,
                         llm_endpoints=llm_endpoints)  # fmt: skip
    client = await connect(temporal_settings.address, temporal_settings.namespace)
    queue = f"wf-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient() as http, running_ingress(cfg) as ingress:
        sender = DiscordSender(DiscordApi(http), channels.send_timeout_s)
        egress = Egress(pool, outbox_keys, {"discord": sender}, secrets, channels)
        db = DbActivities(pool, outbox=outbox_keys, egress=egress)
        llm = LlmActivities(http, SecretStore(env={}), pool, PRICES, endpoints=llm_endpoints)
        workers = [workflow_worker(client, queue, db)]
        workers += [llm_worker(client, k, 4, llm, workflow_queue=queue) for k in (1, 2, 3, 4)]
        relay = Relay(pool, TemporalConnection(temporal_settings), "relay-d", task_queue=queue,
                      entity_roll_after=ROLL_AFTER, entity_idle_s=IDLE_S,
                      turn_timeouts=TurnTimeouts(send_s=20.0))  # fmt: skip
        deliverer = Deliverer(pool, TemporalConnection(temporal_settings), workflow_queue=queue,
                              outbox=outbox_keys)  # fmt: skip
        base = f"http://127.0.0.1:{ingress.bound_http_port}"
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with contextlib.AsyncExitStack() as exits:
            for w in workers:
                await exits.enter_async_context(w)
            tasks = [asyncio.create_task(pump(pool, relay, deliverer)),
                     asyncio.create_task(retry_loop(egress, poll_s=0.2))]  # fmt: skip
            api = await exits.enter_async_context(
                httpx.AsyncClient(base_url=base, headers=headers, timeout=10)
            )
            spec = local_spec(name, f"    - {{kind: discord, account: dc-{name}}}\n")
            await apply_and_start(pool, spec)
            url = f"{base}/channels/discord/dc-{name}"
            try:
                yield Stack(name, fake, pool, api, db, queue, client, cfg, ingress, url)
            finally:
                await cancel_and_wait(tasks, STOP_S)
    await fake.stop()


@contextlib.asynccontextmanager
async def egress_running(s: Stack) -> AsyncIterator[None]:
    async with egress_worker(s.client, s.db, s.queue):
        yield


async def session_up(s: Stack) -> dict[str, Any]:
    """The reader's gateway session is live and its cursor committed."""

    async def up() -> dict[str, Any] | None:
        cursor = await s.cursor()
        live = [x.id for x in s.fake.gateway.live_sessions()]
        return cursor if cursor.get("session_id") in live else None

    return await wait_for(up, timeout=30, interval=0.1, what="the gateway session committed")


async def test_an_interaction_is_deferred_only_after_commit_and_answered_once(
    stack: Stack,
) -> None:
    s = stack
    async with egress_running(s):
        reply = await s.fake.interact(s.url, options={"question": "hello there"})
        # Answered "deferred" only once the record committed: it is there as the answer is.
        inbox = await s.inbox()
        assert reply.status == 200 and reply.body == {"type": 5} and reply.failed is None
        inter = reply.interaction
        assert [r["dedupe_key"] for r in inbox] == [f"interaction:{inter.id}"]

        def answered() -> list[dict[str, Any]] | None:
            return [m for m in s.bot_messages() if m["content"]] or None

        (message,) = await wait_for(now(answered), timeout=60, interval=0.1,
                                    what="the deferred answer filled in")  # fmt: skip
        row = await s.one_outbox("sent")
    assert "hello there" in message["content"]
    assert inter.original is not None and message["id"] == inter.original["id"]
    assert len(s.requests("webhooks")) == 1  # the follow-up went out once
    assert row["provider_message_id"] == message["id"] and row["account"] == s.source
    # The interaction token is a credential: sealed in the envelope, the route and the outbox.
    envelope = inbox[0]["envelope"]
    assert inter.token not in json.dumps(envelope) and inter.token.encode() not in bytes(
        row["recipient"])  # fmt: skip
    assert envelope["data"]["text"] == "/ask question: hello there"
    assert envelope["subject"].startswith("t_") and CHANNEL_ID not in envelope["subject"]
    assert envelope[names.GROUP_ATTRIBUTE] == names.GROUP_CHAT
    # The answer came back over the gateway as the bot's own message: never an input.
    assert len(await s.inbox()) == 1


async def test_a_bad_signature_is_401_and_a_ping_is_pong(stack: Stack) -> None:
    s = stack
    for tamper in ("key", "body", "timestamp", "missing"):
        reply = await s.fake.interact_with_bad_signature(s.url, tamper=tamper)
        assert reply.status == 401, tamper
    ping = await s.fake.interact(s.url, type=1)
    assert ping.status == 200 and ping.body == {"type": 1} and ping.failed is None
    unknown = await s.fake.interact(s.url.replace("/dc-", "/nobody-"))
    assert unknown.status == 404
    # An account no employee reads, though its secret exists: unknown too, nothing stored.
    unread = await s.fake.interact(s.url + "-wrong")
    assert unread.status == 404 and unread.body == unknown.body
    assert await s.inbox() == []


async def test_an_interaction_the_database_cannot_commit_in_time_is_a_500(
    stack: Stack, db_settings: DatabaseSettings
) -> None:
    """Another transaction holds the account's append lock (as a stuck commit would): the
    append times out under its statement timeout and the answer is 500, inside Discord's 3 s."""
    s = stack
    lock = "SELECT pg_advisory_lock(hashtextextended('eventos.append:' || %s, 0))"
    unlock = "SELECT pg_advisory_unlock(hashtextextended('eventos.append:' || %s, 0))"
    async with await db_connect(db_settings, autocommit=True) as holder:  # no transaction
        await holder.execute(lock, (s.source,))
        try:
            refused = await s.fake.interact(s.url, options={"question": "are you there"})
        finally:
            await holder.execute(unlock, (s.source,))
    assert refused.status == 500 and refused.failed == FAILED
    assert await s.inbox() == []  # nothing committed behind the 500
    took = await s.fake.interact(s.url, options={"question": "and now"})
    assert took.status == 200 and took.body == {"type": 5}
    keys = [r["dedupe_key"] for r in await s.inbox()]
    assert keys == [f"interaction:{took.interaction.id}"]


async def test_a_channel_message_is_read_once_and_answered_once_in_its_channel(
    stack: Stack,
) -> None:
    s = stack
    await session_up(s)
    async with egress_running(s):
        posted = await s.fake.post_channel_message(CHANNEL_ID, USER_ID, "hello there")
        sent = await wait_for(now(lambda: s.bot_messages() or None), timeout=60, interval=0.1,
                              what="the reply in the channel")  # fmt: skip
        row = await s.one_outbox("sent")
    assert len(sent) == 1 and "hello there" in sent[0]["content"]
    (create,) = s.requests("channels")
    assert create.body["nonce"] == nonce(row["idempotency_key"], 0)
    assert create.body["enforce_nonce"] is True and len(create.body["nonce"]) <= 25
    inbox = await s.inbox()
    assert [r["dedupe_key"] for r in inbox] == [f"message:{posted['id']}"]
    assert inbox[0]["envelope"]["data"]["reply_to"] == CHANNEL_ID
    assert USER_ID not in json.dumps(inbox[0]["envelope"])  # names, never the user id
    cursor = await s.cursor()
    assert cursor["seq"] >= 2 and cursor["session_id"]  # READY and the message, committed


async def test_a_direct_message_is_its_own_thread_and_answered_in_the_dm(stack: Stack) -> None:
    s = stack
    dm = "1187000000000000777"
    s.fake.add_channel(dm, guild_id=None)
    await session_up(s)
    async with egress_running(s):
        await s.fake.post_channel_message(dm, USER_ID, "just us")
        sent = await wait_for(now(lambda: s.bot_messages(dm) or None), timeout=60, interval=0.1,
                              what="the reply in the DM")  # fmt: skip
    assert len(sent) == 1 and "just us" in sent[0]["content"]
    (row,) = await s.inbox()
    assert (
        names.GROUP_ATTRIBUTE not in row["envelope"] and row["envelope"]["data"]["guild_id"] is None
    )


async def test_a_gateway_drop_resumes_and_the_missed_messages_are_read_once(
    stack: Stack,
) -> None:
    s = stack
    await session_up(s)
    await s.fake.drop_connection(None)  # TCP cut under the reader
    first = await s.fake.post_channel_message(CHANNEL_ID, USER_ID, "while cut")

    async def keys(n: int) -> list[str] | None:
        rows = [r["dedupe_key"] for r in await s.inbox()]
        return rows if len(rows) >= n else None

    await wait_for(lambda: keys(1), timeout=30, what="the message read after the resume")
    assert s.fake.gateway.resumes >= 1 and s.fake.gateway.identifies == 1
    # The whole reader goes away (its replica stops) and a message comes meanwhile: the next
    # reader RESUMEs from the committed seq and Discord replays it.
    await s.stop_ingress()
    second = await s.fake.post_channel_message(CHANNEL_ID, USER_ID, "while stopped")
    async with running_ingress(s.ingress_config):
        got = await wait_for(lambda: keys(2), timeout=30, what="the replayed message read")
    assert got == [f"message:{first['id']}", f"message:{second['id']}"]
    assert s.fake.gateway.identifies == 1  # one session throughout
    # Discord ends the session: the next connection identifies anew.
    async with running_ingress(s.ingress_config):
        await session_up(s)
        await s.fake.gateway.expire_sessions()

        def identified() -> bool:
            return s.fake.gateway.identifies == 2 and bool(s.fake.gateway.live_sessions())

        await wait_for(now(identified), timeout=30, what="a new session identified")
        third = await s.fake.post_channel_message(CHANNEL_ID, USER_ID, "new session")
        got = await wait_for(lambda: keys(3), timeout=30, what="the new session's message")
    assert got[-1] == f"message:{third['id']}"


async def test_a_send_cut_mid_answer_is_called_again_with_the_same_nonce_and_arrives_once(
    stack: Stack,
) -> None:
    s = stack
    await session_up(s)
    cut = Fault(cut=True, deliver=True, route="messages")  # delivered; its answer cut off
    s.fake.fail_next(1, cut)
    async with egress_running(s):
        await s.fake.post_channel_message(CHANNEL_ID, USER_ID, "are you there")
        row = await s.one_outbox("sent")
    creates = s.requests("channels")
    assert len(creates) == 2 and creates[0].body["nonce"] == creates[1].body["nonce"]
    (sent,) = s.bot_messages()
    assert row["provider_message_id"] == sent["id"]
    # Cut twice (the sender's own second try too): the nonce is Discord's key for the send, so
    # the egress calls again, with the same nonce, and Discord answers with the first message.
    s.fake.fail_next(2, cut)
    async with egress_running(s):
        await s.fake.post_channel_message(CHANNEL_ID, USER_ID, "again")

        async def sent_again() -> bool:
            rows = await s.outbox()
            return len(rows) == 2 and rows[1]["status"] == "sent"

        await wait_for(sent_again, timeout=60, interval=0.1, what="the second send")
    assert len(s.bot_messages()) == 2  # one per input: the repeat returned the first
    nonces = [c.body["nonce"] for c in s.requests("channels")[2:]]
    assert len(nonces) == 3 and len(set(nonces)) == 1
    assert (await s.outbox())[1]["attempts"] == 2


async def test_a_page_whose_commit_failed_is_handed_back_and_read_once(
    stack: Stack, db_settings: DatabaseSettings
) -> None:
    """The account's append lock is held, so the reader's commit times out (the account goes
    down); the next read, from the same cursor, hands the page back without a reconnect."""
    s = stack
    await session_up(s)
    lock = "SELECT pg_advisory_lock(hashtextextended('eventos.append:' || %s, 0))"
    unlock = "SELECT pg_advisory_unlock(hashtextextended('eventos.append:' || %s, 0))"
    async with await db_connect(db_settings, autocommit=True) as holder:  # no transaction
        await holder.execute(lock, (s.source,))
        try:
            posted = await s.fake.post_channel_message(CHANNEL_ID, USER_ID, "held back")

            async def down() -> bool:
                rows = await query(s.pool, f"SELECT status FROM channel_accounts "
                                           f"WHERE id = '{s.source}'")  # fmt: skip
                return rows[0]["status"] == "down"

            await wait_for(down, timeout=30, what="the reader's commit failed")
        finally:
            await holder.execute(unlock, (s.source,))

    async def read() -> list[dict[str, Any]] | None:
        return await s.inbox() or None

    (row,) = await wait_for(read, timeout=30, what="the page committed at last")
    assert row["dedupe_key"] == f"message:{posted['id']}"
    assert (s.fake.gateway.identifies, s.fake.gateway.resumes) == (1, 0)  # from memory


async def test_heartbeats_keep_the_session_and_a_reconnect_request_resumes_it(
    stack: Stack,
) -> None:
    s = stack
    await session_up(s)
    s.fake.gateway.heartbeat_interval_ms = 2000  # from the next HELLO on
    await s.fake.gateway.request_reconnect()  # op 7: the reader resumes on a new connection
    await wait_for(now(lambda: s.fake.gateway.resumes == 1), timeout=30, what="the resume")
    beats = s.fake.gateway.heartbeats
    await wait_for(now(lambda: s.fake.gateway.heartbeats >= beats + 3), timeout=30,
                   what="three heartbeats on the new connection")  # fmt: skip
    posted = await s.fake.post_channel_message(CHANNEL_ID, USER_ID, "still here")
    await wait_for(lambda: query(s.pool, f"SELECT 1 FROM bus_ingress WHERE dedupe_key = "
                                         f"'message:{posted['id']}'"),
                   timeout=30, what="the message read on the resumed session")  # fmt: skip
    # Never a missed heartbeat (4009) or a new session: one connection since the resume.
    assert (s.fake.gateway.identifies, s.fake.gateway.resumes) == (1, 1)


async def test_an_account_discord_refuses_is_down_with_an_item(stack: Stack) -> None:
    s = stack
    other = f"{s.name}w"
    await apply_and_start(s.pool, local_spec(
        other, f"    - {{kind: discord, account: dc-{s.name}-wrong}}\n"))  # fmt: skip

    async def raised() -> list[dict[str, Any]] | None:
        return await query(s.pool, f"SELECT * FROM attention_items WHERE employee = '{other}' "
                                   f"AND kind = '{names.ATTENTION_CHANNEL_DOWN}'") or None  # fmt: skip

    (item,) = await wait_for(raised, timeout=30, what="the channel_down item")
    assert item["ref"] == f"discord:dc-{s.name}-wrong" and "401" in item["detail"]
    assert "not.the.token" not in item["detail"]


def outgoing(fake: FakeDiscord, recipient: str, body: str = "hi") -> Outgoing:
    return Outgoing(1, uuid.uuid4().hex, "dc", credential(fake).encode(), recipient, body)


async def test_the_sender_tells_refusals_rate_limits_and_unclear_answers_apart() -> None:
    fake = FakeDiscord()
    await fake.start()
    fake.add_channel("1187000000000000999", can_send=False)
    try:
        async with httpx.AsyncClient() as http:
            sender = DiscordSender(DiscordApi(http), 5)
            unknown = await sender.send(outgoing(fake, "1187000000000000998"))
            assert isinstance(unknown, Refused) and "10003" in unknown.reason
            denied = await sender.send(outgoing(fake, "1187000000000000999"))
            assert isinstance(denied, Refused) and "50001" in denied.reason
            assert isinstance(await sender.send(outgoing(fake, "not-an-id")), Refused)
            fake.set_limit("messages", 1, 30.0)
            assert isinstance(await sender.send(outgoing(fake, CHANNEL_ID)), Delivered)
            limited = await sender.send(outgoing(fake, CHANNEL_ID))
            assert isinstance(limited, Deferred) and (limited.retry_after_s or 0) > 1
            fake.reset()
            fake.fail_next(2)  # a 500, and the one resend after it
            assert isinstance(await sender.send(outgoing(fake, CHANNEL_ID)), Unclear)
            long = await sender.send(outgoing(fake, CHANNEL_ID, "y " * 1500))
            assert isinstance(long, Delivered)
            assert [len(m["content"]) for m in fake.messages(CHANNEL_ID)] == [
                1999,
                1000,
            ]  # split at a space
            expired = await sender.send(outgoing(fake, seal_token(
                parse_credential(credential(fake).encode()), "no-such-token")))  # fmt: skip
            assert isinstance(expired, Refused) and "10015" in expired.reason
    finally:
        await fake.stop()
