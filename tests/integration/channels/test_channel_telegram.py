"""Telegram on the real stack (issue 14): the ingress reader against the Bot API fake, turns on
the dev server, the egress sender under SPEC §11 (buckets, 429s, `unknown` and Retry)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from channel_stack import (
    Stack,
    channel_settings,
    egress_running,
    now,
    running_ingress,
    telegram_spec,
    telegram_stack,
)
from conftest import SECRETS, apply_and_start
from fake_telegram import FakeTelegram
from psycopg_pool import AsyncConnectionPool
from test_router import query
from test_turns import local_spec

from eventos import names
from eventos.channels.readers import ChannelReaders
from eventos.channels.settings import DEFAULT_BUCKETS, Bucket
from eventos.channels.telegram import TelegramApi, TelegramReader
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.delivery.routing import thread_for
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.egress import SendWait
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.service import cancel_and_wait
from eventos.settings import DatabaseSettings, SecretStore, TemporalSettings
from eventos.testing import ConditionTimeout, wait_for


@pytest.fixture
async def stack(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints) as s:  # fmt: skip
        yield s


async def test_a_customer_message_is_read_once_and_answered_once_in_its_chat(stack: Stack) -> None:
    s = stack
    async with egress_running(s):
        update = s.fake.customer_message(s.token, 424242, "hello there")
        sent = await wait_for(now(lambda: s.fake.sent(s.token, 424242) or None), timeout=60,
                              interval=0.1, what="the reply in the customer's chat")  # fmt: skip
        row = await s.one_outbox("sent")

    assert len(sent) == 1 and "hello there" in sent[0]["text"]
    assert row["provider_message_id"] == str(sent[0]["message_id"])
    assert row["account"] == s.source and row["kind"] == "telegram"
    assert b"424242" not in bytes(row["recipient"])  # sealed at rest
    # The update is in the inbox once, under its update_id; the offset confirmed it.
    inbox = await query(s.pool, f"SELECT dedupe_key, envelope FROM bus_ingress "
                                f"WHERE source_key = '{s.source}'")  # fmt: skip
    assert [r["dedupe_key"] for r in inbox] == [f"update:{update['update_id']}"]
    await wait_for(now(lambda: s.fake.confirmed_offset(s.token) > update["update_id"]), timeout=10,
                   what="the page confirmed")  # fmt: skip
    # No id carries the chat: the thread is the salted hash, and so the stream and entity.
    thread = inbox[0]["envelope"]["subject"]
    assert thread.startswith("t_") and "424242" not in thread
    (stream,) = await query(s.pool, f"SELECT stream_key, entity_id FROM bus_streams "
                                    f"WHERE employee = '{s.name}'")  # fmt: skip
    assert stream["stream_key"].endswith("/" + thread_for("subject", inbox[0]["envelope"], 0))
    assert "424242" not in stream["stream_key"] and "424242" not in stream["entity_id"]
    (account,) = await query(s.pool, f"SELECT * FROM channel_accounts WHERE id = '{s.source}'")
    assert account["status"] == "up" and account["cursor"]["offset"] > update["update_id"]


async def test_a_customer_message_read_late_carries_a_lateness_note(stack: Stack) -> None:
    """SPEC §15: customer chats are never dropped but delivered late with a lateness note. A
    message Telegram dated 10 minutes ago (sent while the reader was not reading) reaches the
    model with the note; one sent now does not."""
    s = stack
    async with egress_running(s):
        s.fake.skew -= 600  # the fake's clock, 10 minutes back while the customer writes
        try:
            late = s.fake.customer_message(s.token, 616161, "are you there?")
        finally:
            s.fake.skew += 600
        s.fake.customer_message(s.token, 626262, "hi now")
        for chat in (616161, 626262):
            await wait_for(now(lambda c=chat: s.fake.sent(s.token, c) or None), timeout=60,
                           interval=0.1, what=f"the reply in chat {chat}")  # fmt: skip

    said = await query(s.pool, "SELECT message ->> 'content' AS text FROM transcript_messages "
                       "WHERE employee = %s AND message ->> 'role' = 'user'", s.name)  # fmt: skip
    texts = sorted(str(r["text"]) for r in said)
    sent = datetime.fromtimestamp(late["message"]["date"], UTC).isoformat()
    assert texts[0].startswith(f"are you there?\n[late: sent at {sent}, read 10 min ")
    assert texts[0].endswith(" later]")
    assert texts[1] == "hi now"


async def test_a_group_is_one_thread_whoever_writes(stack: Stack) -> None:
    s = stack
    for who, text in [(7001, "first"), (7002, "second")]:
        s.fake.customer_message(s.token, -100777, text, chat_type="supergroup", from_id=who)

    async def both() -> list[dict[str, Any]] | None:
        rows = await query(s.pool, f"SELECT envelope FROM bus_ingress "
                                   f"WHERE source_key = '{s.source}' ORDER BY id")  # fmt: skip
        return rows if len(rows) == 2 else None

    rows = await wait_for(both, timeout=30, what="both group messages in the inbox")
    subjects = {r["envelope"]["subject"] for r in rows}
    assert len(subjects) == 1
    assert all(r["envelope"][names.GROUP_ATTRIBUTE] == names.GROUP_CHAT for r in rows)


async def test_an_update_telegram_sends_again_is_a_duplicate_never_a_second_input(
    stack: Stack,
) -> None:
    """The reader's cursor commits with its page, so only a cursor behind Telegram's (a
    restored backup) reads a page twice; the update_id makes the second read a duplicate."""
    s = stack
    update = s.fake.customer_message(s.token, 515151, "only once")

    async def inbox() -> list[dict[str, Any]]:
        return await query(s.pool, f"SELECT id FROM bus_ingress WHERE source_key = '{s.source}'")

    await wait_for(inbox, timeout=30, what="the update appended")
    await wait_for(now(lambda: s.fake.confirmed_offset(s.token) > update["update_id"]), timeout=10,
                   what="the page confirmed")  # fmt: skip
    # Telegram offers the update again and the account's cursor is put back before it.
    bot = s.fake.bots[s.token]
    bot.updates.appendleft(update)
    bot.confirmed = update["update_id"]
    bot.wake()
    async with s.pool.connection() as conn:
        await conn.execute("UPDATE channel_accounts SET cursor = jsonb_build_object('offset', "
                           "%s::bigint) WHERE id = %s", (update["update_id"], s.source))  # fmt: skip
    async with running_ingress(s.ingress_config):  # a second replica, reading from the old cursor

        async def read_again() -> bool:
            return s.fake.confirmed_offset(s.token) > update["update_id"] and not bot.updates

        await wait_for(read_again, timeout=30, what="the update read and confirmed again")
    assert len(await inbox()) == 1


async def test_a_429_is_honoured_and_the_reply_goes_out_once(stack: Stack) -> None:
    s = stack
    s.fake.fail_next(s.token, 1, 429, "Too Many Requests: retry after 2", {"retry_after": 2})
    async with egress_running(s):
        s.fake.customer_message(s.token, 616161, "busy day")
        row = await s.one_outbox("sent")
    assert len(s.fake.calls(s.token, "sendMessage")) == 2  # refused once, then sent
    assert len(s.fake.sent(s.token, 616161)) == 1
    assert row["provider_called_at"] is not None
    buckets = await query(s.pool, f"SELECT paused_until FROM egress_buckets "
                                  f"WHERE key = 'a:{s.source}'")  # fmt: skip
    assert buckets and buckets[0]["paused_until"] is not None  # the whole bot waited


async def test_a_send_cut_off_mid_answer_is_unknown_and_only_retry_sends_it_again(
    stack: Stack,
) -> None:
    s = stack
    s.fake.cut_next(s.token, 1, applied=True)  # Telegram sent it; its answer never arrived
    async with egress_running(s):
        s.fake.customer_message(s.token, 717171, "are you there")
        row = await s.one_outbox("unknown")
        await wait_for(lambda: query(s.pool, f"SELECT 1 FROM turns WHERE employee = '{s.name}' "
                                             f"AND status = 'done'"),
                       timeout=30, what="the turn over")  # fmt: skip
        (item,) = await s.attention(names.ATTENTION_SEND_UNKNOWN)
        assert (item["ref"], item["action"], item["state"]) == (
            f"outbox#{row['id']}",
            names.ACTION_RETRY,
            "open",
        )
        # Its cause's category first (issue 26): the connection broke, no answer came.
        assert row["error"].startswith("outage: telegram did not answer: "), row["error"]
        assert item["detail"].endswith(row["error"])
        # The turn is over and its send settled: nothing sends it again on its own.
        assert len(s.fake.calls(s.token, "sendMessage")) == 1
        listed = (await s.api.get("/v1/outbox", params={"status": "unknown"})).json()["outbox"]
        assert [r["id"] for r in listed] == [row["id"]]
        assert "recipient" not in listed[0] and "body" not in listed[0]

        r = await s.api.post(f"/v1/outbox/{row['id']}:retry")
        assert r.status_code == 202, r.text
        await s.one_outbox("sent")
    assert len(s.fake.sent(s.token, 717171)) == 2  # the owner chose to send it again
    (item,) = await s.attention(names.ATTENTION_SEND_UNKNOWN)
    assert item["state"] == "resolved"
    again = await s.api.post(f"/v1/outbox/{row['id']}:retry")
    assert again.status_code == 409


async def test_a_send_telegram_refuses_fails_naming_its_category_and_status(
    stack: Stack,
) -> None:
    """The user blocked the bot: Telegram answers 403, the send is `failed` (never resent on its
    own) with its cause's category and status, on the row and its attention item."""
    s = stack
    s.fake.block(s.token, 727272)
    async with egress_running(s):
        s.fake.customer_message(s.token, 727272, "my pin is 4471, remember it")
        row = await s.one_outbox("failed")
        (item,) = await s.attention(names.ATTENTION_SEND_FAILED)
    assert row["error"].startswith("auth: ") and "403" in row["error"], row["error"]
    assert item["detail"] == f"outbox row {row['id']} was refused: {row['error']}"
    assert "4471" not in item["detail"] and s.token not in item["detail"]


async def test_a_send_whose_worker_dies_after_the_call_is_unknown_not_resent(
    stack: Stack,
) -> None:
    s = stack
    s.fake.hang_next(s.token, 1, applied=False)  # the call reaches Telegram and hangs there
    async with egress_running(s):
        s.fake.customer_message(s.token, 818181, "hello?")

        async def called() -> bool:
            rows = await s.outbox()
            return bool(rows) and rows[0]["provider_called_at"] is not None

        await wait_for(called, timeout=60, interval=0.1, what="the provider called")
    # That worker is gone mid-call; another takes the activity's retry.
    async with egress_running(s):
        row = await s.one_outbox("unknown")
    assert s.fake.sent(s.token, 818181) == []  # it never arrived, but no one could know
    assert len(await s.attention(names.ATTENTION_SEND_UNKNOWN)) == 1
    assert len(s.fake.calls(s.token, "sendMessage")) == 1
    s.fake.release_hangs()
    async with egress_running(s):
        item = (await s.attention(names.ATTENTION_SEND_UNKNOWN))[0]
        r = await s.api.post(f"/v1/attention/{item['id']}:act", json={"action": "retry"})
        assert r.status_code == 202, r.text
        assert r.json()["outbox"] == row["id"]
        await s.one_outbox("sent")
    assert len(s.fake.sent(s.token, 818181)) == 1


async def queue_send(s: Stack, keys: OutboxKeys, chat_id: int, text: str) -> int:
    key = uuid.uuid4().hex
    sealed = keys.seal(str(chat_id), employee=s.name, idempotency_key=key)
    async with s.pool.connection() as conn:
        cur = await conn.execute(Q["outbound_insert"], {
            "key": key, "employee": s.name, "thread": "t_test", "turn_id": f"turn-{key}",
            "account": s.source, "recipient": sealed.blob, "recipient_key_id": sealed.key_id,
            "kind": "telegram", "class": 2, "body": text, "audience": None,
        })  # fmt: skip
        return int((await cur.fetchone() or {})["id"])


async def test_a_burst_to_one_recipient_waits_for_its_bucket_instead_of_failing(
    stack: Stack, outbox_keys: OutboxKeys
) -> None:
    s = stack
    s.fake.customer_message(s.token, 919191, "hi")  # the chat exists at the fake
    # One send per 2 s to the chat: a send of the burst that took longer (a busy machine)
    # would find its token refilled and never wait; at 2 per second, one of 0.5 s did.
    buckets = {**DEFAULT_BUCKETS, "telegram": {"account": Bucket(30, 30),
                                                "recipient": Bucket(0.5, 1.0)}}  # fmt: skip
    egress = dataclasses.replace(s.egress, settings=dataclasses.replace(
        s.egress.settings, buckets=buckets))  # fmt: skip
    s.fake.limits.private = (1, 0.4)  # Telegram's per-chat limit, tighter than the bucket
    ids = [await queue_send(s, outbox_keys, 919191, f"part {n}") for n in range(3)]
    waits = 0
    for outbound_id in ids:  # as the send activity's retries do: wait the delay, try again
        while True:
            try:
                assert await egress.send(outbound_id) == "sent"
                break
            except SendWait as exc:
                waits += 1
                await asyncio.sleep(exc.wait_s)  # the delay the activity would be retried after
    assert waits >= 2  # the burst waited for tokens
    assert [m["text"] for m in s.fake.sent(s.token, 919191)] == ["part 0", "part 1", "part 2"]
    assert len(s.fake.calls(s.token, "sendMessage")) == 3  # never a 429 from Telegram


async def test_above_high_water_a_send_waits_until_the_sends_ahead_of_it_left(
    stack: Stack, outbox_keys: OutboxKeys
) -> None:
    s = stack
    s.fake.customer_message(s.token, 929292, "hi")
    s.fake.limits.private = None  # this test is about the high water, not Telegram's limits
    egress = dataclasses.replace(s.egress, settings=dataclasses.replace(
        s.egress.settings, high_water=2))  # fmt: skip
    ids = [await queue_send(s, outbox_keys, 929292, f"to {n}") for n in range(3)]
    with pytest.raises(SendWait, match="high water"):
        await egress.send(ids[2])  # two open sends of the account are ahead of it
    assert s.fake.calls(s.token, "sendMessage") == []  # nothing was claimed or called
    assert (await query(s.pool, "SELECT status FROM outbound_messages WHERE id = %s",
                        ids[2]))[0]["status"] == "queued"  # fmt: skip
    assert await egress.send(ids[0]) == "sent"
    assert await egress.send(ids[2]) == "sent"  # one ahead now: under the high water


async def test_an_account_down_for_long_raises_an_item_that_clears_when_it_reads_again(
    stack: Stack,
) -> None:
    s = stack
    s.fake.fail_next(s.token, 1000, 401, "Unauthorized", method="getUpdates")

    async def raised() -> list[dict[str, Any]] | None:
        return await s.attention(names.ATTENTION_CHANNEL_DOWN) or None

    (item,) = await wait_for(raised, timeout=30, what="the channel_down item")
    assert item["state"] == "open" and item["ref"] == s.source and "401" in item["detail"]
    (account,) = await query(s.pool, f"SELECT status FROM channel_accounts WHERE id = '{s.source}'")
    assert account["status"] == "down"
    s.fake.faults[(s.token, "getupdates")].clear()

    async def cleared() -> bool:
        return (await s.attention(names.ATTENTION_CHANNEL_DOWN))[0]["state"] == "resolved"

    await wait_for(cleared, timeout=60, what="the item resolved by a good read")


async def test_an_account_two_employees_read_has_one_down_item_and_reads_on(stack: Stack) -> None:
    """The attention key is (kind, ref): one open item per account, however many employees
    read it (an item per employee made the raise fail and the reader loop with it)."""
    s = stack
    other = f"c{uuid.uuid4().hex[:8]}"
    await apply_and_start(
        s.pool, local_spec(other, f"    - {{kind: telegram, account: tg-{s.name}}}\n")
    )
    s.fake.fail_next(s.token, 1000, 401, "Unauthorized", method="getUpdates")
    sql = (f"SELECT * FROM attention_items WHERE kind = '{names.ATTENTION_CHANNEL_DOWN}' "
           f"AND ref = '{s.source}' ORDER BY id")  # fmt: skip

    async def raised() -> list[dict[str, Any]] | None:
        return await query(s.pool, sql) or None

    (item,) = await wait_for(raised, timeout=30, what="the channel_down item")
    assert item["state"] == "open" and item["employee"] in {s.name, other}
    s.fake.faults[(s.token, "getupdates")].clear()

    async def cleared() -> bool:
        return [i["state"] for i in await query(s.pool, sql)] == ["resolved"]

    await wait_for(cleared, timeout=60, what="the one item resolved by a good read")


@pytest.fixture
async def bounded(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    """The stack with a backlog bound of 3 unconsumed inputs per account."""
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, backlog_max=3) as s:  # fmt: skip
        yield s


async def lease_renewals(s: Stack, k: int) -> None:
    """Wait until the account's lease was renewed `k` more times (the readers' clock)."""
    seen: set[Any] = set()

    async def renewed() -> bool:
        (row,) = await query(s.pool, f"SELECT lease_until FROM channel_accounts "
                                     f"WHERE id = '{s.source}'")  # fmt: skip
        seen.add(row["lease_until"])
        return len(seen) > k

    await wait_for(renewed, timeout=60, interval=0.2, what=f"{k} lease renewals")


async def test_past_its_backlog_bound_the_reader_stops_asking_and_resumes_losing_nothing(
    bounded: Stack,
) -> None:
    s = bounded
    await wait_for(now(lambda: s.fake.calls(s.token, "getUpdates") or None), timeout=30,
                   what="the reader polling")  # fmt: skip
    s.consuming.clear()  # the employee makes no progress: routed inputs stay undelivered
    updates = [s.fake.customer_message(s.token, 5101 + i % 2, f"order {i}") for i in range(7)]
    keys = [f"update:{u['update_id']}" for u in updates]

    async def raised() -> list[dict[str, Any]] | None:
        return await s.attention(names.ATTENTION_CHANNEL_BACKPRESSURE) or None

    (item,) = await wait_for(raised, timeout=60, what="the channel_backpressure item")
    assert item["state"] == "open" and item["ref"] == s.source and "bound 3" in item["detail"]
    asked = len(s.fake.calls(s.token, "getUpdates"))
    await lease_renewals(s, 3)  # the paused reader had several turns to ask again
    assert len(s.fake.calls(s.token, "getUpdates")) == asked  # it did not
    inbox = await query(s.pool, f"SELECT dedupe_key FROM bus_ingress "
                                f"WHERE source_key = '{s.source}' ORDER BY id")  # fmt: skip
    assert [r["dedupe_key"] for r in inbox] == keys[:3]  # read up to the bound, no further
    pending_ids = [u["update_id"] for u in s.fake.pending(s.token)]
    assert pending_ids[-4:] == [u["update_id"] for u in updates[3:]]  # Telegram keeps the rest

    s.consuming.set()
    async with egress_running(s):

        async def drained() -> bool:
            done = await query(s.pool, f"SELECT count(*) AS n FROM bus_deliveries d JOIN "
                                       f"bus_streams t USING (stream_key) WHERE t.employee = "
                                       f"'{s.name}' AND d.status = 'done'")  # fmt: skip
            return done[0]["n"] == len(updates) and not s.fake.pending(s.token)

        await wait_for(drained, timeout=180, interval=0.2, what="every update consumed")
    inbox = await query(s.pool, f"SELECT dedupe_key FROM bus_ingress "
                                f"WHERE source_key = '{s.source}' ORDER BY id")  # fmt: skip
    assert [r["dedupe_key"] for r in inbox] == keys  # each once, in order
    items = await s.attention(names.ATTENTION_CHANNEL_BACKPRESSURE)  # a pause per bound's worth
    assert items and all(i["state"] == "resolved" for i in items)


async def test_stopping_the_last_employee_reading_an_account_stops_its_reader(stack: Stack) -> None:
    s = stack
    await wait_for(now(lambda: s.fake.calls(s.token, "getUpdates") or None), timeout=30,
                   what="the reader polling")  # fmt: skip
    r = await s.api.post(f"/v1/employees/{s.name}:stop", json={})
    assert r.status_code == 202, r.text

    async def released() -> bool:
        (row,) = await query(s.pool, f"SELECT lease_owner, status FROM channel_accounts "
                                     f"WHERE id = '{s.source}'")  # fmt: skip
        return row["lease_owner"] is None and row["status"] == "idle"

    await wait_for(released, timeout=60, interval=0.2, what="the account's lease given back")
    asked = len(s.fake.calls(s.token, "getUpdates"))
    update = s.fake.customer_message(s.token, 616161, "anyone there?")
    with pytest.raises(ConditionTimeout):  # several refresh rounds (1 s) pass without a call
        await wait_for(now(lambda: len(s.fake.calls(s.token, "getUpdates")) > asked),
                       timeout=5, what="a getUpdates call after the stop")  # fmt: skip
    assert s.fake.pending(s.token)[-1] == update  # Telegram keeps it for the next reader


class Counted(TelegramReader):
    """The Telegram reader of one replica, counting its getUpdates calls and dating the first."""

    def __init__(self, api: TelegramApi, poll_timeout_s: int) -> None:
        super().__init__(api, poll_timeout_s)
        self.reads = 0
        self.first: datetime | None = None

    async def read(self, token: bytes, cursor: dict[str, Any], limit: int = 100) -> Any:
        self.reads += 1
        self.first = self.first or datetime.now(UTC)
        return await super().read(token, cursor, limit)


class Vanishing(ChannelReaders):
    """A replica that dies as a killed process does: its readers end, its leases stay held
    until they expire."""

    async def stop(self) -> None:
        tasks = [task for _, task in self.running.values()]
        self.running.clear()
        await cancel_and_wait(tasks, 30)


async def test_one_replica_reads_an_account_and_another_takes_over_when_its_lease_expires(
    pool: AsyncConnectionPool[Conn],
) -> None:
    fake = FakeTelegram()
    await fake.start()
    token, name = fake.add_bot(), f"c{uuid.uuid4().hex[:8]}"
    source = f"telegram:tg-{name}"
    secrets = SecretStore(env={**SECRETS, f"EVENTOS_SECRET_TG_{name.upper()}": token})
    channels = channel_settings(fake)  # leases of 5 s, renewed every 1 s
    await apply_and_start(pool, telegram_spec(name))

    async def inbox() -> list[str]:
        rows = await query(pool, f"SELECT dedupe_key FROM bus_ingress "
                                 f"WHERE source_key = '{source}' ORDER BY id")  # fmt: skip
        return [r["dedupe_key"] for r in rows]

    async def account() -> dict[str, Any]:
        (row,) = await query(pool, f"SELECT * FROM channel_accounts WHERE id = '{source}'")
        return row

    async with httpx.AsyncClient() as http:
        a_reader, b_reader = (Counted(TelegramApi(http, fake.base_url), 1) for _ in range(2))
        a = Vanishing(pool, secrets, channels, {"telegram": a_reader}, owner="replica-a")
        b = ChannelReaders(pool, secrets, channels, {"telegram": b_reader}, owner="replica-b")
        a_task = asyncio.create_task(a.run())
        try:
            await wait_for(now(lambda: a_reader.reads or None), timeout=30, what="A reading")
            b_task = asyncio.create_task(b.run())
            updates = [fake.customer_message(token, 7101, f"first {i}") for i in range(3)]
            keys = [f"update:{u['update_id']}" for u in updates]
            await wait_for(lambda: _equal(inbox, keys), timeout=30, what="A's pages committed")
            with pytest.raises(ConditionTimeout):  # B renews nothing while A's lease holds
                await wait_for(now(lambda: b_reader.reads or None), timeout=4,
                               what="B calling getUpdates")  # fmt: skip
            held = await account()
            assert held["lease_owner"] == "replica-a"
            await cancel_and_wait([a_task], 30)  # A dies; its lease stays until it expires
            expired_at = (await account())["lease_until"]
            updates += [fake.customer_message(token, 7102, f"then {i}") for i in range(3)]
            keys = [f"update:{u['update_id']}" for u in updates]
            await wait_for(lambda: _equal(inbox, keys), timeout=60, what="B read the rest")
            await wait_for(now(lambda: not fake.pending(token)), timeout=30,
                           what="every update confirmed")  # fmt: skip
            taken = await account()
            assert taken["lease_owner"] == "replica-b"
            assert taken["fencing"] == held["fencing"] + 1
            assert b_reader.first is not None and b_reader.first >= expired_at
            assert await inbox() == keys  # each update once: none lost, none doubled
            await cancel_and_wait([b_task], 30)
        finally:
            await cancel_and_wait([a_task], 30)
            await fake.stop()


async def _equal(read: Callable[[], Awaitable[list[str]]], want: list[str]) -> bool:
    return await read() == want
