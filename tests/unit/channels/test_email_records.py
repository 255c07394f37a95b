"""The email channel's parsing (a mail as a record, hostile mail as a dead row), its Message-ID
maker, its replies, and its account secret."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email import policy
from email.parser import BytesParser

import pytest

from eventos import names
from eventos.channels.email import EmailAccount, EmailConfigError
from eventos.channels.email_records import (
    TEXT_MAX_BYTES,
    Answered,
    answered_by,
    build_reply,
    dedupe_key,
    html_text,
    mail_record,
    normalise_message_id,
    read_mail,
    reply_message_id,
    reply_subject,
)
from eventos.channels.settings import ChannelSettings
from eventos.channels.threads import thread_id
from eventos.errors import ConfigError

SALT = b"s" * 32
ACCOUNT = "email:em-main"


def mail(*headers: str, body: str = "hello", raw_body: bytes | None = None) -> bytes:
    head = "\r\n".join(headers).encode()
    return head + b"\r\n\r\n" + (raw_body if raw_body is not None else body.encode())


def record(raw: bytes, too_large: int | None = None):  # type: ignore[no-untyped-def]
    item = {"uid": 7, "raw": raw, "too_large": too_large, "own": "em@shop.test"}
    return mail_record(ACCOUNT, SALT, item)


def test_a_mail_is_a_record_threaded_by_its_sender() -> None:
    raw = mail("From: Alice Doe <Alice@Example.test>", "To: em@shop.test", "Subject: Order 12",
               "Message-ID: <abc.123@example.test>", "In-Reply-To: <first@shop.test>",
               "References: <zero@shop.test> <first@shop.test>",
               "Date: Tue, 01 Dec 2026 10:00:00 +0100", body="Where is it?")  # fmt: skip
    rec = record(raw)
    assert (rec.status, rec.error, rec.source_key) == (names.INGRESS_ACCEPTED, None, ACCOUNT)
    assert rec.dedupe_key == "message-id:abc.123@example.test"
    env = rec.envelope or {}
    assert env["subject"] == thread_id(SALT, "email", "em-main", "alice@example.test")
    assert "alice" not in env["subject"]
    assert env["time"] == "2026-12-01T10:00:00+01:00"
    data = env["data"]
    assert data["reply_to"] == "alice@example.test" and data["from_name"] == "Alice Doe"
    assert (data["subject"], data["text"]) == ("Order 12", "Where is it?")
    assert data["message_id"] == "abc.123@example.test"
    assert data["in_reply_to"] == "first@shop.test"
    assert data["references"] == ["zero@shop.test", "first@shop.test"]


def test_a_human_mail_is_answered_whatever_its_auto_submitted_says() -> None:
    assert read_mail(mail("From: a@b.test", "Auto-Submitted: no"), "em@shop.test")["text"]


def test_the_plain_part_is_preferred_and_html_alone_is_stripped() -> None:
    alternative = mail(
        "From: a@b.test", "MIME-Version: 1.0",
        'Content-Type: multipart/alternative; boundary="B"',
        raw_body=b"--B\r\nContent-Type: text/html\r\n\r\n<p>html</p>\r\n"
                 b"--B\r\nContent-Type: text/plain\r\n\r\nplain\r\n--B--\r\n",
    )  # fmt: skip
    assert read_mail(alternative)["text"].strip() == "plain"
    only_html = mail("From: a@b.test", "Content-Type: text/html",
                     body="<html><head><style>p{}</style></head><body><p>Hi <b>you</b></p>"
                          "<script>x()</script><p>a &amp; b</p></body></html>")  # fmt: skip
    assert read_mail(only_html)["text"] == "Hi you\na & b"
    assert html_text("<div>one</div><div>two</div>") == "one\ntwo"


def test_text_is_bounded_and_controls_removed() -> None:
    data = read_mail(mail("From: a@b.test", body="x\x00y\x07z" + "é" * TEXT_MAX_BYTES))
    assert data["text"].startswith("xyz") and data["text_truncated"] is True
    assert len(data["text"].encode()) <= TEXT_MAX_BYTES
    unknown_charset = mail("From: a@b.test", "Content-Type: text/plain; charset=x-nonsense",
                           raw_body=b"caf\xc3\xa9 \xff")  # fmt: skip
    assert read_mail(unknown_charset)["text"].startswith("café")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (mail("Subject: no sender"), "no From header"),
        (mail("From: a@b.test", "From: c@d.test"), "several From headers"),
        (mail("From: a@b.test, c@d.test"), "several From addresses"),
        (mail("From: undisclosed:;"), "no From address"),
        (mail("From: alice@evil.test@good.test"), "the From address is not a plain mailbox"),
        (mail("From: =?utf-8?q?victim=40bank.test?="), "the From address is not a plain mailbox"),
        (mail("From: =?utf-8?b?dmljdGltQGJhbmsudGVzdCA8dmljdGltQGJhbmsudGVzdD4=?= <a@b.test>"),
         "an encoded From name posing as an address"),
        (mail("From: a@b.test", "Subject: a\x00b"), "a NUL byte in the headers"),
        (mail("From: a@b.test", 'Content-Type: multipart/mixed; boundary="XYZ"',
              body="no boundary anywhere"), "broken MIME: a multipart without parts"),
        (b"\xff\xfe garbage without headers", "no From header"),
        (mail("From: a@b.test", "Auto-Submitted: auto-replied"),
         "an automatic mail (Auto-Submitted: auto-replied), not answered"),
        (mail("From: a@b.test", "Precedence: bulk"), "a bulk mail (Precedence: bulk), not answered"),
        (mail("From: Mail Delivery System <MAILER-DAEMON@b.test>"),
         "a delivery report (bounce), not answered"),
        (mail("From: a@b.test", 'Content-Type: multipart/report; report-type=delivery-status; '
              'boundary="R"', raw_body=b"--R\r\n\r\nfailed\r\n--R--\r\n"),
         "a delivery report (bounce), not answered"),
        (mail("From: Em <em@shop.test>"), "the account's own mail, not answered"),
    ],
)  # fmt: skip
def test_a_hostile_mail_is_a_dead_row_with_its_reason(raw: bytes, reason: str) -> None:
    rec = record(raw)
    assert (rec.status, rec.error) == (names.INGRESS_DEAD, reason)
    assert rec.envelope is not None and "subject" not in rec.envelope
    assert rec.envelope["data"]["dedupe_key"] == rec.dedupe_key


def test_a_mail_over_the_bound_is_dead_but_still_deduplicated() -> None:
    head = b"From: a@b.test\r\nMessage-ID: <big@b.test>\r\n\r\n"
    rec = record(head, too_large=6_000_000)
    assert rec.status == names.INGRESS_DEAD and "6000000 bytes" in (rec.error or "")
    assert rec.dedupe_key == "message-id:big@b.test"


def test_message_ids_are_normalised() -> None:
    assert normalise_message_id(" <a.b@c.test>\r\n ") == "a.b@c.test"
    assert normalise_message_id("a.b@c.test") == "a.b@c.test"
    assert normalise_message_id("junk <x@y> more") == "x@y"
    assert normalise_message_id("") is None and normalise_message_id(None) is None
    long = normalise_message_id("<" + "x" * 600 + "@y>")
    assert long is not None and long.startswith("sha256:") and len(long) < 80


def test_a_mail_without_message_id_is_keyed_by_its_identifying_headers() -> None:
    raw = mail("From: a@b.test", "To: c@d.test", "Date: Tue, 01 Dec 2026 10:00:00 +0000",
               "Subject: hi")  # fmt: skip
    relayed = b"Received: from relay.test by mx.test; Tue, 01 Dec 2026 10:00:01 +0000\r\n" + raw
    assert dedupe_key(raw) == dedupe_key(relayed)  # a relay's added header changes nothing
    assert dedupe_key(raw).startswith("headers:")
    assert dedupe_key(raw) != dedupe_key(raw.replace(b"Subject: hi", b"Subject: ho"))


def test_the_reply_message_id_is_made_from_the_idempotency_key() -> None:
    one = reply_message_id("key-1", "shop.test")
    assert one == reply_message_id("key-1", "shop.test")  # every attempt of the row
    assert one != reply_message_id("key-2", "shop.test")
    assert one.startswith("<") and one.endswith("@shop.test>")
    assert "key-1" not in one


def test_a_reply_is_threaded_under_the_mail_it_answers() -> None:
    answered = Answered("q1@cust.test", "Order 12", ("q0@cust.test",))
    now = datetime(2026, 12, 1, tzinfo=UTC)
    reply = build_reply("em@shop.test", "cust@cust.test", "It ships today.", "<r@shop.test>",
                        answered, now)  # fmt: skip
    assert reply["Subject"] == "Re: Order 12" and reply["Message-ID"] == "<r@shop.test>"
    assert reply["In-Reply-To"] == "<q1@cust.test>"
    assert reply["References"] == "<q0@cust.test> <q1@cust.test>"
    assert (reply["From"], reply["To"]) == ("em@shop.test", "cust@cust.test")
    first = build_reply("em@shop.test", "c@c.test", "\nHello there\nmore", "<r2@shop.test>",
                        None, now)  # fmt: skip
    assert first["Subject"] == "Hello there" and first["In-Reply-To"] is None
    assert reply_subject("RE: again", "x") == "RE: again"
    parsed = BytesParser(policy=policy.default).parsebytes(reply.as_bytes(policy=policy.SMTP))
    assert parsed.get_content().strip() == "It ships today."


def test_only_a_mail_from_the_recipient_is_answered() -> None:
    head = b"From: Cust <cust@cust.test>\r\nSubject: hi\r\nMessage-ID: <m1@cust.test>\r\n\r\n"
    assert answered_by(head, "cust@cust.test") == Answered("m1@cust.test", "hi", ())
    assert answered_by(head, "other@cust.test") is None
    assert answered_by(b"From: cust@cust.test\r\n\r\n", "cust@cust.test") is None  # no id


def account_doc(**overrides: object) -> bytes:
    doc = {
        "address": "em@shop.test",
        "password": "pw",
        "imap_host": "imap.shop.test",
        "imap_port": 993,
        "smtp_host": "smtp.shop.test",
        "smtp_port": 465,
        "tls": "tls",
    }
    doc.update(overrides)
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


def test_the_account_secret_is_validated_with_clear_errors() -> None:
    account = EmailAccount.parse(account_doc())
    assert (account.username, account.mailbox, account.sent_mailbox) == (
        "em@shop.test", "INBOX", "Sent")  # fmt: skip
    assert account.domain == "shop.test" and "pw" not in repr(account)
    for bad, message in [
        (b"not json", "not JSON"),
        (b"[1]", "JSON object"),
        (account_doc(tls="ssl"), "'tls' must be one of"),
        (account_doc(imap_port=0), "'imap_port' must be a port"),
        (account_doc(smtp_port="25"), "'smtp_port' must be a port"),
        (account_doc(address="not-an-address"), "'address' must be a plain mailbox"),
        (account_doc(password=None), "'password'"),
        (account_doc(imap_host="a\r\nb"), "'imap_host' must be"),
        (account_doc(extra=1), "unknown fields ['extra']"),
    ]:
        with pytest.raises(EmailConfigError, match=message.replace("[", r"\[")):
            EmailAccount.parse(bad)


def test_the_poll_interval_is_a_setting() -> None:
    assert ChannelSettings.from_env({}).email_poll_s == 15
    assert ChannelSettings.from_env({"EVENTOS_CHANNELS_EMAIL_POLL_S": "3"}).email_poll_s == 3
    with pytest.raises(ConfigError, match="EVENTOS_CHANNELS_EMAIL_POLL_S"):
        ChannelSettings.from_env({"EVENTOS_CHANNELS_EMAIL_POLL_S": "0"})
