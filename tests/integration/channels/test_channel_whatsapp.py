"""WhatsApp Business on the real stack (issue 14): Meta's webhook into the ingress, turns on the
dev server, the egress sender against the Cloud API fake, the 24-hour window, receipts, and
scenario (a) of RFC-0005 §22 through merge point B2."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from channel_stack import channel_services, egress_running, now
from conftest import SECRETS, apply_and_start
from fake_whatsapp import FakeWhatsApp, Number, sign, titled
from psycopg_pool import AsyncConnectionPool
from test_router import query
from test_turns import local_spec, transcripts

from eventos import names
from eventos.channels.senders import Sender
from eventos.channels.settings import ChannelSettings
from eventos.channels.whatsapp import WhatsAppSender
from eventos.conversations.turns import TurnInput, reply_key
from eventos.db import Conn
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.egress import Egress, request_retry
from eventos.outbox.keys import OutboxKeys
from eventos.settings import DatabaseSettings, SecretStore, TemporalSettings
from eventos.testing import wait_for
from eventos.workers.activities import DbActivities

APP_SECRET = "app-secret-" + "0123456789abcdef"
VERIFY_TOKEN = "verify-" + "me-42"
CUSTOMER = "16505551234"
DAY_S = 24 * 3600


def secret_env(name: str, fake: FakeWhatsApp, number: Number, **extra: Any) -> dict[str, str]:
    doc = {"phone_number_id": number.phone_number_id, "access_token": number.token,
           "app_secret": APP_SECRET, "verify_token": VERIFY_TOKEN, "graph_api": fake.base_url,
           "graph_version": "v21.0", **extra}  # fmt: skip
    return {**SECRETS, f"EVENTOS_SECRET_WA_{name.upper()}": json.dumps(doc)}


@dataclass
class Stack:
    name: str
    fake: FakeWhatsApp
    number: Number
    pool: AsyncConnectionPool[Conn]
    egress: Egress
    db: DbActivities
    queue: str
    client: Any
    url: str
    consuming: asyncio.Event

    @property
    def source(self) -> str:
        return f"whatsapp_business:wa-{self.name}"

    @property
    def pnid(self) -> str:
        return self.number.phone_number_id

    async def write(self, text: str, wa_id: str = CUSTOMER) -> Any:
        return await self.fake.customer_message(self.url, APP_SECRET, self.pnid, wa_id, text)

    async def inbox(self) -> list[dict[str, Any]]:
        return await query(self.pool, f"SELECT id, dedupe_key, status, error, envelope "
                                      f"FROM bus_ingress WHERE source_key = '{self.source}' "
                                      f"ORDER BY id")  # fmt: skip

    async def outbox(self) -> list[dict[str, Any]]:
        sql = f"SELECT * FROM outbound_messages WHERE employee = '{self.name}' ORDER BY id"
        return await query(self.pool, sql)

    async def one_outbox(self, status: str) -> dict[str, Any]:
        async def settled() -> dict[str, Any] | None:
            rows = await self.outbox()
            return rows[0] if rows and rows[0]["status"] == status else None

        return await wait_for(settled, timeout=60, interval=0.1, what=f"an outbox row {status}")


@contextlib.asynccontextmanager
async def whatsapp_stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
    **settings: Any,
) -> AsyncIterator[Stack]:  # fmt: skip
    fake = FakeWhatsApp()
    await fake.start()
    number = fake.add_number()
    name = f"c{uuid.uuid4().hex[:8]}"
    secrets = SecretStore(env=secret_env(name, fake, number))
    channels = ChannelSettings(refresh_s=1, send_timeout_s=5, **settings)

    def senders(http: httpx.AsyncClient) -> dict[str, Sender]:
        return {"whatsapp_business": WhatsAppSender(http, pool, channels.send_timeout_s)}

    try:
        async with channel_services(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                                    llm_endpoints, secrets=secrets, channels=channels,
                                    senders=senders) as s:  # fmt: skip
            spec = local_spec(name, f"    - {{kind: whatsapp_business, account: wa-{name}}}\n")
            await apply_and_start(pool, spec)
            url = f"{s.url}/channels/whatsapp/wa-{name}"
            yield Stack(name, fake, number, pool, s.egress, s.db, s.queue, s.client, url,
                        s.consuming)  # fmt: skip
    finally:
        await fake.stop()


@pytest.fixture
async def stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with whatsapp_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints) as s:  # fmt: skip
        yield s


async def test_the_verification_answers_the_challenge_only_for_the_right_token(
    stack: Stack,
) -> None:
    s = stack
    assert (await s.fake.verify(s.url, VERIFY_TOKEN)).ok
    wrong = await s.fake.verify(s.url, "not-the-token")
    assert wrong.status == 403 and wrong.challenge not in wrong.body
    assert (await s.fake.verify(s.url, VERIFY_TOKEN, mode="unsubscribe")).status == 403
    elsewhere = s.url.replace(f"wa-{s.name}", "wa-nobody")
    assert (await s.fake.verify(elsewhere, VERIFY_TOKEN)).status == 404


async def test_a_bad_signature_is_401_and_stores_nothing(stack: Stack) -> None:
    s = stack
    forged = await s.fake.customer_message(s.url, "another-secret", s.pnid, CUSTOMER, "hi")
    assert forged.attempts == [401]
    async with httpx.AsyncClient() as http:
        unsigned = await http.post(s.url, content=forged.body,
                                   headers={"Content-Type": "application/json"})  # fmt: skip
        assert unsigned.status_code == 401
        body = b"x" * (1024 * 1024 + 1)
        big = await http.post(s.url, content=body,
                              headers={"X-Hub-Signature-256": "sha256=" + sign(APP_SECRET, body)})  # fmt: skip
        assert big.status_code == 413
    assert await s.inbox() == []
    assert await query(s.pool, f"SELECT 1 FROM whatsapp_windows WHERE account = '{s.source}'") == []


async def test_a_customer_message_is_answered_once_in_their_chat(stack: Stack) -> None:
    s = stack
    async with egress_running(s):
        delivery = await s.write("hello there")
        sent = await wait_for(now(lambda: s.fake.sent(s.pnid, CUSTOMER) or None), timeout=60,
                              interval=0.1, what="the reply to the customer")  # fmt: skip
        row = await s.one_outbox("sent")
    assert delivery.attempts == [200]
    wamid = delivery.payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
    assert len(sent) == 1 and "hello there" in sent[0]["text"]
    assert sent[0]["context"] == wamid  # the reply answers the customer's message
    assert row["provider_message_id"] == sent[0]["id"] and row["kind"] == "whatsapp_business"
    assert CUSTOMER.encode() not in bytes(row["recipient"])  # sealed at rest
    (item,) = await s.inbox()
    assert item["dedupe_key"] == f"wamid:{wamid}"
    envelope = item["envelope"]
    assert envelope["subject"].startswith("t_") and CUSTOMER not in envelope["subject"]
    data = envelope["data"]
    assert (data["reply_to"], data["text"], data["wamid"], data["type"], data["name"]) == (
        CUSTOMER, "hello there", wamid, "text", "Ada Lovelace")  # fmt: skip
    (window,) = await query(s.pool, f"SELECT * FROM whatsapp_windows "
                                    f"WHERE account = '{s.source}'")  # fmt: skip
    assert window["last_wamid"] == wamid and CUSTOMER not in window["counterpart"]


async def test_a_redelivered_notification_is_a_duplicate_never_a_second_input(
    stack: Stack,
) -> None:
    s = stack
    delivery = await s.write("only once")
    await s.fake.redeliver(delivery)  # Meta posts it again, byte for byte
    assert delivery.attempts == [200, 200]
    assert len(await s.inbox()) == 1

    async def routed() -> list[dict[str, Any]] | None:
        rows = await query(s.pool, f"SELECT seq FROM bus_deliveries d JOIN bus_streams s "
                                   f"USING (stream_key) WHERE s.employee = '{s.name}'")  # fmt: skip
        return rows or None

    assert len(await wait_for(routed, timeout=30, what="the input routed")) == 1


async def test_a_malformed_entry_is_a_dead_row_and_its_neighbours_land(stack: Stack) -> None:
    s = stack
    value = {"messaging_product": "whatsapp",
             "metadata": {"display_phone_number": "1555", "phone_number_id": s.pnid},
             "contacts": [{"profile": {"name": "Bo"}, "wa_id": CUSTOMER}],
             "messages": [{"from": CUSTOMER, "id": "wamid.good1", "timestamp": "1700000000",
                           "type": "text", "text": {"body": "fine"}},
                          {"id": "wamid.nosender", "type": "text", "text": {"body": "?"}},
                          {"from": CUSTOMER, "id": "wamid.nul", "type": "text",
                           "text": {"body": "a\u0000b"}},
                          {"from": CUSTOMER, "id": "wamid.img", "type": "image",
                           "image": {"id": "m1", "mime_type": "image/jpeg"}}]}  # fmt: skip
    payload = {"object": "whatsapp_business_account",
               "entry": [{"id": "1", "changes": [{"field": "messages", "value": value}]}]}  # fmt: skip
    body = json.dumps(payload).encode()
    async with httpx.AsyncClient() as http:
        r = await http.post(s.url, content=body,
                            headers={"X-Hub-Signature-256": "sha256=" + sign(APP_SECRET, body)})  # fmt: skip
    assert r.status_code == 200, r.text
    rows = {row["dedupe_key"]: row for row in await s.inbox()}
    assert set(rows) == {"wamid:wamid.good1", "wamid:wamid.nosender", "wamid:wamid.nul",
                         "wamid:wamid.img"}  # fmt: skip
    assert rows["wamid:wamid.good1"]["status"] == names.INGRESS_ACCEPTED
    assert rows["wamid:wamid.nosender"]["status"] == names.INGRESS_DEAD
    assert rows["wamid:wamid.nosender"]["error"] == "a message without a sender"
    assert rows["wamid:wamid.nul"]["status"] == names.INGRESS_DEAD
    image = rows["wamid:wamid.img"]
    assert image["status"] == names.INGRESS_ACCEPTED
    assert (
        image["envelope"]["data"]["type"] == "image" and image["envelope"]["data"]["text"] is None
    )


async def test_statuses_move_the_receipt_of_the_sent_row(stack: Stack) -> None:
    s = stack
    async with egress_running(s):
        await s.write("track this")
        row = await s.one_outbox("sent")
    wamid = row["provider_message_id"]
    for status in ("delivered", "read"):
        d = await s.fake.status(s.url, APP_SECRET, s.pnid, wamid, status)
        assert d.attempts == [200]
        (row,) = await s.outbox()
        assert row["receipt"]["status"] == status
    late = await s.fake.status(s.url, APP_SECRET, s.pnid, wamid, "delivered")  # out of order
    assert late.attempts == [200]
    assert (await s.outbox())[0]["receipt"]["status"] == "read"
    stray = await s.fake.status(s.url, APP_SECRET, s.pnid, "wamid.unknown", "read", wa_id=CUSTOMER)
    assert stray.attempts == [200]  # a status of no row of ours is ignored, never an error
    assert len(await s.inbox()) == 1  # statuses are not inputs


async def close_window(s: Stack, wa_id: str = CUSTOMER) -> None:
    """The customer last wrote 25 h ago, on our side and at Meta."""
    async with s.pool.connection() as conn:
        await conn.execute("UPDATE whatsapp_windows SET last_inbound_at = now() - interval "
                           "'25 hours' WHERE account = %s", (s.source,))  # fmt: skip
    s.fake.open_window(s.pnid, wa_id, at=s.fake.now() - DAY_S - 3600)


async def test_a_reply_outside_the_window_is_held_window_closed(stack: Stack) -> None:
    s = stack
    await s.write("see you tomorrow")
    await s.one_outbox("queued")  # the turn replied; the egress is not running yet
    await close_window(s)
    async with egress_running(s):
        row = await s.one_outbox("held")
    assert row["held_reason"] == names.HELD_WINDOW_CLOSED
    assert row["provider_called_at"] is None and row["claim_token"] is None
    assert s.fake.sent(s.pnid) == []
    (item,) = await query(s.pool, f"SELECT * FROM attention_items WHERE employee = '{s.name}' "
                                  f"AND kind = '{names.ATTENTION_SEND_HELD}'")  # fmt: skip
    assert item["ref"] == f"outbox#{row['id']}" and CUSTOMER not in item["detail"]
    assert item["action"] == names.ACTION_RETRY
    # The customer wrote again elsewhere (the window reopened): the owner's Retry sends it once.
    async with s.pool.connection() as conn:
        await conn.execute("UPDATE whatsapp_windows SET last_inbound_at = now() "
                           "WHERE account = %s", (s.source,))  # fmt: skip
    s.fake.open_window(s.pnid, CUSTOMER)
    async with s.pool.connection() as conn:
        await request_retry(conn, row["id"])  # POST /v1/outbox/{id}:retry
    assert (await s.one_outbox("sent"))["id"] == row["id"]  # the egress's retry loop sent it
    assert len(s.fake.sent(s.pnid, CUSTOMER)) == 1


async def test_meta_refusing_for_the_window_holds_the_reply_too(stack: Stack) -> None:
    """Our window row says open, Meta says 131047: held, nothing sent, nothing retried."""
    s = stack
    await s.write("hello")
    await s.one_outbox("queued")
    s.fake.open_window(s.pnid, CUSTOMER, at=s.fake.now() - DAY_S - 3600)  # at Meta only
    async with egress_running(s):
        row = await s.one_outbox("held")
    assert row["held_reason"] == names.HELD_WINDOW_CLOSED and s.fake.sent(s.pnid) == []


async def test_with_a_template_a_reply_outside_the_window_sends_the_template(
    stack: Stack,
) -> None:
    s = stack
    await s.write("see you tomorrow")
    row = await s.one_outbox("queued")
    await close_window(s)
    template = {"name": "follow_up", "language": "en_US"}
    secrets = SecretStore(env=secret_env(s.name, s.fake, s.number, template=template))
    egress = dataclasses.replace(s.egress, secrets=secrets)
    assert await egress.send(row["id"]) == "sent"
    (sent,) = s.fake.sent(s.pnid, CUSTOMER)
    assert sent["type"] == "template"
    assert sent["request"]["template"] == {"name": "follow_up", "language": {"code": "en_US"}}
    assert (await s.outbox())[0]["provider_message_id"] == sent["id"]


async def test_scenario_a_three_messages_while_the_turn_replies_make_one_reply(
    stack: Stack,
) -> None:
    """RFC-0005 §22 (a): a customer writes, three more messages arrive while the turn is
    answering; merge point B2 keeps the unsent draft and one more step answers all four in one
    reply, keyed over the four consumed inputs."""
    s = stack
    async with egress_running(s):
        await s.write("first question\nsleep: 8")

        async def step_running() -> bool:
            rows = await query(s.pool, f"SELECT 1 FROM turns WHERE employee = '{s.name}' "
                                       f"AND status = 'running'")  # fmt: skip
            return bool(rows)

        await wait_for(step_running, timeout=30, interval=0.1, what="the first turn running")
        for text in ("second", "third", "fourth"):
            assert (await s.write(text)).attempts == [200]
        row = await s.one_outbox("sent")
        sent = s.fake.sent(s.pnid, CUSTOMER)
    assert len(sent) == 1 and len(await s.outbox()) == 1
    (turn,) = await query(s.pool, f"SELECT id, status, consumed_seq FROM turns "
                                  f"WHERE employee = '{s.name}'")  # fmt: skip
    assert (turn["status"], turn["consumed_seq"]) == ("done", 4)
    ((_, messages),) = (await transcripts(s.pool, s.name)).items()
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert users[0] == "first question\nsleep: 8" and users[-3:] == ["second", "third", "fourth"]
    assert any("not sent" in u for u in users)  # B2's note after the kept draft
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"] == row["body"]
    assert sent[0]["text"] == row["body"] and "fourth" in row["body"]
    deliveries = await query(s.pool, f"SELECT d.ingress_id, d.route, d.stream_key "
                                     f"FROM bus_deliveries d JOIN bus_streams s "
                                     f"USING (stream_key) WHERE s.employee = '{s.name}' "
                                     f"ORDER BY d.seq")  # fmt: skip
    assert len(deliveries) == 4
    first = SimpleNamespace(stream_key=deliveries[0]["stream_key"], route=deliveries[0]["route"])
    key = reply_key(cast(TurnInput, first), [int(d["ingress_id"]) for d in deliveries])
    assert row["idempotency_key"] == key


async def test_the_numbers_throughput_limit_waits_and_the_reply_goes_out_once(
    stack: Stack,
) -> None:
    s = stack
    s.fake.fail_next(s.pnid, 1, titled(130429))
    async with egress_running(s):
        await s.write("busy day")
        row = await s.one_outbox("sent")
    assert len(s.fake.sent(s.pnid, CUSTOMER)) == 1 and row["provider_called_at"] is not None
    (bucket,) = await query(s.pool, f"SELECT paused_until FROM egress_buckets "
                                    f"WHERE key = 'a:{s.source}'")  # fmt: skip
    assert bucket["paused_until"] is not None  # the whole number waited


async def test_a_send_cut_off_mid_answer_is_unknown_never_resent_on_its_own(stack: Stack) -> None:
    s = stack
    s.fake.cut_next(s.pnid, 1, applied=True)  # Meta took it; its answer never arrived
    async with egress_running(s):
        await s.write("are you there")
        row = await s.one_outbox("unknown")
        (item,) = await query(s.pool, f"SELECT * FROM attention_items WHERE employee = "
                                      f"'{s.name}' AND kind = '{names.ATTENTION_SEND_UNKNOWN}'")  # fmt: skip
    assert item["ref"] == f"outbox#{row['id']}" and item["action"] == names.ACTION_RETRY
    assert len(s.fake.sent(s.pnid, CUSTOMER)) == 1  # sent once, by the call that was cut


async def test_past_its_backlog_bound_the_webhook_answers_429_and_metas_retry_lands(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> None:  # fmt: skip
    async with whatsapp_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, backlog_max=3) as s:  # fmt: skip
        s.consuming.clear()  # the employee makes no progress: routed inputs stay undelivered
        first = [await s.write(f"order {i}", wa_id=f"1650555{1000 + i}") for i in range(3)]
        assert [d.attempts for d in first] == [[200], [200], [200]]
        refused = await s.write("one more", wa_id="16505552000")
        assert refused.attempts == [429] and refused.retry_after == "30"
        assert len(await s.inbox()) == 3  # not appended
        (item,) = await query(pool, f"SELECT * FROM attention_items WHERE employee = '{s.name}' "
                                    f"AND kind = '{names.ATTENTION_CHANNEL_BACKPRESSURE}'")  # fmt: skip
        assert item["state"] == "open" and item["ref"] == s.source

        s.consuming.set()
        async with egress_running(s):

            async def landed() -> bool:
                await s.fake.redeliver(refused)  # Meta retries with backoff; here at once
                return refused.delivered

            await wait_for(landed, timeout=180, interval=1.0, what="the retry accepted")
            inbox = await s.inbox()
            texts = [r["envelope"]["data"]["text"] for r in inbox]
            assert sorted(texts) == ["one more", "order 0", "order 1", "order 2"]  # each once
            (item,) = await query(pool, f"SELECT state FROM attention_items WHERE employee = "
                                        f"'{s.name}' AND kind = "
                                        f"'{names.ATTENTION_CHANNEL_BACKPRESSURE}'")  # fmt: skip
            assert item["state"] == "resolved"
