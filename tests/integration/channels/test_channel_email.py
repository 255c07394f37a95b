"""Email on the real stack (issue 14): the IMAP poller and the SMTP sender against the real
mail servers of the test harness (aiosmtpd delivering into pymap), turns on the dev server, the
egress sender under SPEC §11 (a Message-ID looked up in Sent before any resend)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from channel_stack import STOP_S, channel_services, egress_running
from conftest import PURPOSES, PURPOSES_VAR, SECRETS, apply_and_start
from mail_servers import MailServers, MailUser
from psycopg_pool import AsyncConnectionPool
from test_router import query
from test_turns import local_spec

from eventos import names
from eventos.channels.email import EmailReader, EmailSender
from eventos.channels.email_records import reply_message_id
from eventos.channels.readers import ChannelReaders
from eventos.channels.senders import Delivered, Outgoing, Sender
from eventos.channels.settings import ChannelSettings
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.egress import Egress
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.service import cancel_and_wait
from eventos.settings import DatabaseSettings, SecretStore, TemporalSettings
from eventos.testing import wait_for
from eventos.workers.activities import DbActivities

CHANNELS = ChannelSettings(poll_timeout_s=1, refresh_s=1, lease_ttl_s=5, down_alert_s=1,
                           send_timeout_s=5, email_poll_s=1)  # fmt: skip
HUGE_BYTES = 6 * 1024 * 1024  # over the reader's 5 MiB bound


def credential(mail: MailServers, user: MailUser) -> str:
    return json.dumps({
        "address": user.address, "username": user.address, "password": user.password,
        "imap_host": mail.host, "imap_port": mail.imap_port, "smtp_host": mail.host,
        "smtp_port": mail.smtp_port, "tls": "none",
    })  # fmt: skip


@dataclass
class Account:
    """An employee reading a hosted mailbox (`em-<name>`), and a customer writing to it."""

    name: str
    pool: AsyncConnectionPool[Conn]
    mail: MailServers
    user: MailUser
    customer: MailUser
    secrets: SecretStore

    @property
    def source(self) -> str:
        return f"email:em-{self.name}"

    async def inbox(self) -> list[dict[str, Any]]:
        return await query(self.pool, f"SELECT dedupe_key, status, error, envelope FROM bus_ingress "
                                      f"WHERE source_key = '{self.source}' ORDER BY id")  # fmt: skip

    async def cursor(self) -> dict[str, Any]:
        rows = await query(self.pool, f"SELECT cursor FROM channel_accounts "
                                      f"WHERE id = '{self.source}'")  # fmt: skip
        return dict(rows[0]["cursor"] or {}) if rows else {}

    def seen(self, uid: int) -> bool:
        return any(m.uid == uid and m.seen for m in self.mail.messages(self.user))

    async def rows(self, n: int) -> list[dict[str, Any]]:
        async def enough() -> list[dict[str, Any]] | None:
            rows = await self.inbox()
            return rows if len(rows) >= n else None

        return await wait_for(enough, timeout=30, what=f"{n} mails in the inbox")

    async def read_past(self, uid: int) -> None:
        async def past() -> bool:
            return int((await self.cursor()).get("uid") or 0) >= uid

        await wait_for(past, timeout=30, what=f"the cursor past UID {uid}")


def email_spec(name: str) -> str:
    return local_spec(name, f"    - {{kind: email, account: em-{name}}}\n")


@pytest.fixture
async def account(pool: AsyncConnectionPool[Conn], mail: MailServers) -> Account:
    name = f"m{uuid.uuid4().hex[:8]}"
    user, customer = mail.new_user("em"), mail.new_user("cust")
    secrets = SecretStore(env={**SECRETS, f"EVENTOS_SECRET_EM_{name.upper()}":
                               credential(mail, user)})  # fmt: skip
    await apply_and_start(pool, email_spec(name))
    return Account(name, pool, mail, user, customer, secrets)


@contextlib.asynccontextmanager
async def reading(a: Account, reader: EmailReader) -> AsyncIterator[None]:
    """The channel readers of one ingress replica, with `reader` as its email driver."""
    readers = ChannelReaders(a.pool, a.secrets, CHANNELS, {"email": reader})
    task = asyncio.create_task(readers.run())
    try:
        yield
    finally:
        await cancel_and_wait([task], STOP_S)


class Observed(EmailReader):
    """The email reader, recording each page's UIDs and what was true when it confirmed them,
    and failing its first `failures` confirms (the IMAP server gone after the commit)."""

    def __init__(self, observe: Callable[[list[int]], Awaitable[Any]], failures: int = 0,
                 **bounds: int) -> None:  # fmt: skip
        super().__init__(0.2, **bounds)
        self.observe, self.failures = observe, failures
        self.pages: list[list[int]] = []
        self.at_confirm: list[Any] = []

    async def read(self, token: bytes, cursor: dict[str, Any], limit: int = 100) -> Any:
        items, after = await super().read(token, cursor, limit)
        if items:
            self.pages.append([i["uid"] for i in items])
        return items, after

    async def confirm(self, token: bytes, items: list[dict[str, Any]]) -> None:
        self.at_confirm.append(await self.observe([i["uid"] for i in items]))
        if self.failures > 0:
            self.failures -= 1
            raise OSError("the IMAP server went away")
        await super().confirm(token, items)


async def test_a_mail_is_marked_read_only_after_its_commit_and_never_read_twice(
    account: Account,
) -> None:
    a = account

    async def observe(uids: list[int]) -> tuple[int, bool]:
        return len(await a.inbox()), any(a.seen(u) for u in uids)

    reader = Observed(observe, failures=1)
    async with reading(a, reader):
        first_id, first = a.mail.deliver_inbound(a.user, a.customer.address, "one", "first")
        await a.rows(1)
        await wait_for(lambda: asyncio.sleep(0, reader.at_confirm), timeout=10,
                       what="the first confirm")  # fmt: skip
        second_id, second = a.mail.deliver_inbound(a.user, a.customer.address, "two", "second")
        rows = await a.rows(2)
        await wait_for(lambda: asyncio.sleep(0, a.seen(second)), timeout=10,
                       what="the second mail marked read")  # fmt: skip
    # Each confirm came after its page committed, with the mail still unread.
    assert reader.at_confirm == [(1, False), (2, False)]
    assert not a.seen(first)  # its confirm failed; the cursor moved past it all the same
    assert reader.pages == [[first], [second]]  # read once each
    assert [r["dedupe_key"] for r in rows] == [f"message-id:{first_id.strip('<>')}",
                                               f"message-id:{second_id.strip('<>')}"]  # fmt: skip
    assert (await a.cursor())["uid"] == second


async def test_a_page_is_bounded_in_mails_and_in_bytes(account: Account) -> None:
    a = account

    async def nothing(uids: list[int]) -> None:
        return None

    uids = [a.mail.deliver_inbound(a.user, a.customer.address, f"m{n}", "x" * 3000)[1]
            for n in range(5)]  # fmt: skip
    reader = Observed(nothing, page_messages=2, page_bytes=5000)
    async with reading(a, reader):
        await a.rows(5)
        await a.read_past(uids[-1])
    # Two mails at most; a second ~3 KB mail would pass 5 KB, so it waits for the next page.
    assert reader.pages == [[u] for u in uids]
    many = [a.mail.deliver_inbound(a.user, a.customer.address, f"n{n}", "y")[1] for n in range(5)]
    reader = Observed(nothing, page_messages=2)
    async with reading(a, reader):
        await a.rows(10)
        await a.read_past(many[-1])
    assert reader.pages == [many[0:2], many[2:4], many[4:]]


async def test_unseen_mail_is_searched_in_windows_and_read_mail_is_skipped(
    account: Account,
) -> None:
    a = account
    uids = [a.mail.deliver_inbound(a.user, a.customer.address, f"m{n}", "x")[1] for n in range(7)]
    with a.mail.imap(a.user) as client:  # read in a mail client before the employee polls
        client.select("INBOX")
        client.uid("STORE", ",".join(map(str, uids[:5])), "+FLAGS.SILENT", r"(\Seen)")
    reader = EmailReader(0.2, search_window=2)
    async with reading(a, reader):
        rows = await a.rows(2)
        await a.read_past(uids[-1])
    assert [r["envelope"]["data"]["subject"] for r in rows] == ["m5", "m6"]
    assert (await a.cursor())["uid"] == uids[-1]


async def test_a_mail_delivered_twice_is_one_input_and_a_rebuilt_mailbox_doubles_nothing(
    account: Account,
) -> None:
    a = account
    async with reading(a, EmailReader(0.2)):
        message_id, first = a.mail.deliver_inbound(a.user, a.customer.address, "hi", "once")
        await a.rows(1)
        _, again = a.mail.deliver_inbound(a.user, a.customer.address, "hi", "once",
                                          message_id=message_id)  # a redelivery  # fmt: skip
        await a.read_past(again)
        await wait_for(lambda: asyncio.sleep(0, a.seen(again)), timeout=10, what="read")
        assert len(await a.inbox()) == 1
        # The server rebuilds the mailbox (a new UIDVALIDITY) while a mail is still unread.
        with a.mail.imap(a.user) as client:
            client.select("INBOX")
            client.uid("STORE", str(first), "-FLAGS.SILENT", r"(\Seen)")
        validity = a.mail.renew_inbox(a.user)
        later_id, _ = a.mail.deliver_inbound(a.user, a.customer.address, "later", "new one")

        async def renewed() -> bool:
            cursor = await a.cursor()
            return cursor.get("uidvalidity") == validity and int(cursor.get("uid") or 0) >= 3

        await wait_for(renewed, timeout=30, what="the rebuilt mailbox read")
        await wait_for(lambda: asyncio.sleep(0, all(m.seen for m in a.mail.messages(a.user))),
                       timeout=10, what="every mail marked read")  # fmt: skip
    keys = [r["dedupe_key"] for r in await a.inbox()]
    assert keys == [f"message-id:{message_id.strip('<>')}", f"message-id:{later_id.strip('<>')}"]


def hostile_mails(sender: str, to: str) -> dict[str, bytes]:
    def raw(*headers: str, body: bytes = b"hello") -> bytes:
        return "\r\n".join([*headers, f"To: {to}"]).encode() + b"\r\n\r\n" + body

    mid = lambda: f"Message-ID: <{uuid.uuid4().hex}@example.test>"  # noqa: E731
    return {
        "no From header": raw("Subject: anonymous", mid()),
        "a NUL byte in the headers": raw(f"From: {sender}", "Subject: a\x00b", mid()),
        "broken MIME: a multipart without parts": raw(
            f"From: {sender}", mid(), 'Content-Type: multipart/mixed; boundary="XYZ"',
            body=b"no boundary anywhere"),
        "an automatic mail (Auto-Submitted: auto-replied), not answered": raw(
            f"From: {sender}", mid(), "Auto-Submitted: auto-replied"),
        # What responders that say no Auto-Submitted put on their mail (issue 25 point 7).
        "an automatic mail (X-Autoreply: yes), not answered": raw(
            f"From: {sender}", mid(), "X-Autoreply: yes"),
        "an automatic mail (X-Autorespond: Out of office), not answered": raw(
            f"From: {sender}", mid(), "X-Autorespond: Out of office"),
        "an automatic mail (X-Auto-Response-Suppress: All), not answered": raw(
            f"From: {sender}", mid(), "X-Auto-Response-Suppress: All"),
        "a bulk mail (Precedence: bulk), not answered": raw(
            f"From: {sender}", mid(), "Precedence: bulk"),
        "a bulk mail (Precedence: junk), not answered": raw(
            f"From: {sender}", mid(), "Precedence: junk"),
        "a bulk mail (Precedence: list), not answered": raw(
            f"From: {sender}", mid(), "Precedence: list"),
        "a list's mail (List-Id: Announcements <news.example.test>), not answered": raw(
            f"From: {sender}", mid(), "List-Id: Announcements <news.example.test>"),
        "a mail with no return path (Return-Path: <>), not answered": raw(
            "Return-Path: <>", f"From: {sender}", mid()),
        "an encoded From name posing as an address": raw(
            f"From: =?utf-8?q?boss=40example.test?= <{sender}>", mid()),
        f"mail of {HUGE_BYTES + 400} bytes, over the bound": b"",  # filled in below
    }  # fmt: skip


async def test_a_hostile_mail_is_a_dead_row_and_its_neighbours_still_land(
    account: Account,
) -> None:
    a = account
    mails = hostile_mails(a.customer.address, a.user.address)
    huge_key = next(k for k in mails if k.startswith("mail of"))
    huge = (
        f"From: {a.customer.address}\r\nTo: {a.user.address}\r\nSubject: huge\r\n"
        f"Message-ID: <huge-{uuid.uuid4().hex}@example.test>\r\n\r\n"
    ).encode()
    mails[huge_key] = huge + b"x" * (HUGE_BYTES + 400 - len(huge))  # fmt: skip
    a.mail.deliver_inbound(a.user, a.customer.address, "before", "good one")
    for raw in mails.values():
        a.mail.imap_append(a.user, raw)
    _, last = a.mail.deliver_inbound(a.user, a.customer.address, "after", "good two")
    async with reading(a, EmailReader(0.2)):
        rows = await a.rows(len(mails) + 2)
        await a.read_past(last)
    assert [r["status"] for r in (rows[0], rows[-1])] == [names.INGRESS_ACCEPTED] * 2
    assert [r["envelope"]["data"]["text"].strip() for r in (rows[0], rows[-1])] == [
        "good one", "good two"]  # fmt: skip
    assert [(r["status"], r["error"]) for r in rows[1:-1]] == [
        (names.INGRESS_DEAD, reason) for reason in mails
    ]
    assert all(r["dedupe_key"].startswith("message-id:") for r in rows)


async def test_an_account_that_cannot_log_in_is_down_with_the_reason(
    pool: AsyncConnectionPool[Conn], mail: MailServers
) -> None:
    name = f"m{uuid.uuid4().hex[:8]}"
    user, customer = mail.new_user("em"), mail.new_user("cust")
    wrong = json.loads(credential(mail, user)) | {"password": "not-the-password"}
    secrets = SecretStore(
        env={PURPOSES_VAR: PURPOSES, f"EVENTOS_SECRET_EM_{name.upper()}": json.dumps(wrong)}
    )
    await apply_and_start(pool, email_spec(name))
    a = Account(name, pool, mail, user, customer, secrets)

    async def down() -> list[dict[str, Any]] | None:
        sql = f"SELECT * FROM attention_items WHERE kind = '{names.ATTENTION_CHANNEL_DOWN}' " \
              f"AND ref = '{a.source}'"  # fmt: skip
        return await query(pool, sql) or None

    async with reading(a, EmailReader(0.2)):
        (item,) = await wait_for(down, timeout=30, what="the channel_down item")
        sql = f"SELECT status, error FROM channel_accounts WHERE id = '{a.source}'"
        (row,) = await query(pool, sql)
    assert row["status"] == "down" and "AUTHENTICATIONFAILED" in row["error"]
    assert "not-the-password" not in row["error"] and "not-the-password" not in item["detail"]


async def queue_reply(a: Account, keys: OutboxKeys, body: str) -> tuple[int, str]:
    key = uuid.uuid4().hex
    sealed = keys.seal(a.customer.address, employee=a.name, idempotency_key=key)
    async with a.pool.connection() as conn:
        cur = await conn.execute(Q["outbound_insert"], {
            "key": key, "employee": a.name, "thread": "t_test", "turn_id": f"turn-{key}",
            "account": a.source, "recipient": sealed.blob, "recipient_key_id": sealed.key_id,
            "kind": "email", "class": 2, "body": body, "audience": None,
        })  # fmt: skip
        return int((await cur.fetchone() or {})["id"]), key


async def test_a_claim_whose_worker_died_after_calling_is_sent_once_by_its_message_id(
    account: Account, outbox_keys: OutboxKeys
) -> None:
    """Egress takes an expired claim over for an idempotent sender; the Sent mailbox says
    whether the dead attempt's mail went out."""
    a = account
    egress = Egress(a.pool, outbox_keys, {"email": EmailSender(5)}, a.secrets, CHANNELS)
    went_out, key = await queue_reply(a, outbox_keys, "this one went out")
    never, _ = await queue_reply(a, outbox_keys, "this one never left")
    cred = a.secrets.resolve(f"em-{a.name}", "channel")
    earlier = Outgoing(went_out, key, f"em-{a.name}", cred, a.customer.address, "this one went out")
    assert isinstance(await EmailSender(5).send(earlier), Delivered)  # the attempt that died
    async with a.pool.connection() as conn:  # both attempts called SMTP and were never heard of
        await conn.execute("UPDATE outbound_messages SET status = 'sending', claim_token = 'gone', "
                           "claimed_at = now() - interval '1 hour', provider_called_at = now() "
                           "- interval '1 hour' WHERE id = ANY(%s)", ([went_out, never],))  # fmt: skip
    assert await egress.send(went_out) == "sent"
    assert await egress.send(never) == "sent"
    bodies = sorted(m.content.decode().rstrip().rsplit("\n", 1)[-1] for m in
                    a.mail.messages(a.customer))  # fmt: skip
    assert bodies == ["this one never left", "this one went out"]  # each exactly once
    assert len(a.mail.accepted(a.customer)) == 2


# -- the whole stack: a mail in, a reply out -------------------------------------------------


@dataclass
class Stack:
    account: Account
    api: httpx.AsyncClient
    egress: Egress
    db: DbActivities
    queue: str
    client: Any

    async def outbox(self) -> list[dict[str, Any]]:
        return await query(self.account.pool, f"SELECT * FROM outbound_messages "
                                              f"WHERE employee = '{self.account.name}'")  # fmt: skip

    async def one_outbox(self, status: str) -> dict[str, Any]:
        async def settled() -> dict[str, Any] | None:
            rows = await self.outbox()
            return rows[0] if rows and rows[0]["status"] == status else None

        return await wait_for(settled, timeout=60, interval=0.1, what=f"an outbox row {status}")

    async def attention(self, kind: str) -> list[dict[str, Any]]:
        return await query(self.account.pool, f"SELECT * FROM attention_items WHERE employee = "
                                              f"'{self.account.name}' AND kind = '{kind}'")  # fmt: skip

    def replies(self) -> list[Any]:
        """The mails that reached the customer's INBOX."""
        return self.account.mail.messages(self.account.customer)


@pytest.fixture
async def stack(
    account: Account, db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Stack]:  # fmt: skip
    def senders(http: httpx.AsyncClient) -> dict[str, Sender]:
        return {"email": EmailSender(CHANNELS.send_timeout_s)}

    async with channel_services(account.pool, db_settings, tmp_path, temporal_settings,
                                outbox_keys, llm_endpoints, secrets=account.secrets,
                                channels=CHANNELS, senders=senders) as s,  egress_running(s):  # fmt: skip
        yield Stack(account, s.api, s.egress, s.db, s.queue, s.client)


async def test_a_mail_in_is_one_input_and_one_reply_to_its_sender(stack: Stack) -> None:
    s, a = stack, stack.account
    asked_id, asked = a.mail.deliver_inbound(a.user, a.customer.address, "Order 12",
                                             "where is my order?")  # fmt: skip
    row = await s.one_outbox("sent")
    (reply,) = s.replies()
    sent = reply.content.decode()
    message_id = reply_message_id(str(row["idempotency_key"]), a.user.address.split("@")[1])
    assert reply.message_id == message_id == row["provider_message_id"]
    assert reply.subject == "Re: Order 12" and "where is my order?" in sent
    assert f"In-Reply-To: {asked_id}" in sent and f"From: {a.user.address}" in sent
    assert "Auto-Submitted: auto-replied" in sent  # no other responder answers it (RFC 3834)
    assert [m.message_id for m in a.mail.messages(a.user, "Sent")] == [message_id]
    (accepted,) = a.mail.accepted(a.customer)
    assert accepted.auth_login == a.user.address
    assert row["account"] == a.source and row["kind"] == "email"
    assert a.customer.address.encode() not in bytes(row["recipient"])  # sealed at rest
    (inbound,) = await a.inbox()
    assert inbound["dedupe_key"] == f"message-id:{asked_id.strip('<>')}"
    thread = inbound["envelope"]["subject"]
    assert thread.startswith("t_") and "cust" not in thread
    await wait_for(lambda: asyncio.sleep(0, a.seen(asked)), timeout=10, what="marked read")


async def test_an_auto_reply_is_never_answered_and_a_reply_says_it_is_one(stack: Stack) -> None:
    """Another responder's mail (no Auto-Submitted, but X-Autoreply) is a dead row with its
    reason and starts no turn; the customer's mail after it is answered, once, and the answer
    that went through the SMTP server says `Auto-Submitted: auto-replied`."""
    s, a = stack, stack.account
    a.mail.deliver_inbound(a.user, a.customer.address, "Out of office",
                                        "I am away until Monday.",
                                        headers={"X-Autoreply": "yes"})  # fmt: skip
    asked_id, _ = a.mail.deliver_inbound(a.user, a.customer.address, "Order 7",
                                         "where is order 7?")  # fmt: skip
    row = await s.one_outbox("sent")
    auto_row, asked_row = await a.rows(2)
    assert (auto_row["status"], auto_row["error"]) == (
        names.INGRESS_DEAD,
        "an automatic mail (X-Autoreply: yes), not answered",
    )
    assert asked_row["status"] != names.INGRESS_DEAD
    (reply,) = s.replies()
    assert f"In-Reply-To: {asked_id}" in reply.content.decode()
    assert "Auto-Submitted: auto-replied" in reply.content.decode()
    (accepted,) = a.mail.accepted(a.customer)  # what the SMTP server took
    assert b"Auto-Submitted: auto-replied" in accepted.content
    assert [r["id"] for r in await s.outbox()] == [row["id"]]  # the auto-reply: no turn
    turns = await query(a.pool, f"SELECT count(*) AS n FROM turns WHERE employee = '{a.name}'")
    assert turns[0]["n"] == 1  # the customer's mail's


async def test_a_send_cut_off_after_data_is_found_in_sent_when_called_again_never_mailed_twice(
    stack: Stack,
) -> None:
    s, a = stack, stack.account
    a.mail.drop_after_data(1)  # delivered, but the 250 never reaches the sender
    a.mail.deliver_inbound(a.user, a.customer.address, "hello", "are you there?")
    # The Message-ID is the provider's key: the egress calls again, and the call finds the
    # mail in Sent instead of mailing it a second time.
    sent = await s.one_outbox("sent")
    assert sent["attempts"] == 2
    (reply,) = s.replies()  # exactly one mail arrived
    assert sent["provider_message_id"] == reply.message_id
    assert len(a.mail.accepted(a.customer)) == 1  # the retry found it in Sent: no second SMTP
    assert await s.attention(names.ATTENTION_SEND_UNKNOWN) == []


async def test_a_450_waits_and_is_sent_once(stack: Stack) -> None:
    s, a = stack, stack.account
    a.mail.fail_next(1, 450)
    a.mail.deliver_inbound(a.user, a.customer.address, "busy", "hello")
    row = await s.one_outbox("sent")
    assert a.mail.faults_left() == 0  # the first attempt met the 450
    (reply,) = s.replies()
    assert reply.message_id == row["provider_message_id"]
    assert len(a.mail.accepted(a.customer)) == 1
    assert await s.attention(names.ATTENTION_SEND_FAILED) == []


async def test_a_550_fails_the_send_with_an_attention_item(stack: Stack) -> None:
    s, a = stack, stack.account
    a.mail.fail_next(1, 550)
    a.mail.deliver_inbound(a.user, a.customer.address, "refused", "hello")
    row = await s.one_outbox("failed")
    assert a.mail.faults_left() == 0 and "550" in (row["error"] or "")
    (item,) = await s.attention(names.ATTENTION_SEND_FAILED)
    assert item["ref"] == f"outbox#{row['id']}" and item["state"] == "open"
    assert s.replies() == [] and a.mail.accepted(a.customer) == []
