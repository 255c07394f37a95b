"""The channel subsystem's pure parts: thread ids, send buckets, settings, Telegram records."""

from __future__ import annotations

import pytest

from eventos import names
from eventos.channels import buckets
from eventos.channels.settings import Bucket, ChannelSettings, parse_buckets
from eventos.channels.telegram import next_offset, update_record
from eventos.channels.threads import thread_id
from eventos.errors import ConfigError

SALT = b"s" * 32


def test_a_thread_id_is_stable_salted_and_carries_no_address() -> None:
    one = thread_id(SALT, "telegram", "tg-main", "+4915100000")
    assert one == thread_id(SALT, "telegram", "tg-main", "+4915100000")
    assert one.startswith("t_") and len(one) == 34 and "4915100000" not in one
    assert one != thread_id(b"t" * 32, "telegram", "tg-main", "+4915100000")  # another instance
    assert one != thread_id(SALT, "telegram", "tg-other", "+4915100000")  # another account


def test_c4_sends_use_only_the_top_half_of_a_bucket() -> None:
    bucket = Bucket(rate=2.0, burst=10.0)
    assert buckets.wait_for(1.0, bucket, names.C2_CUSTOMER) == 0
    assert buckets.wait_for(5.5, bucket, names.C4_BACKGROUND) == pytest.approx(0.25)
    assert buckets.wait_for(6.0, bucket, names.C4_BACKGROUND) == 0
    single = Bucket(rate=1.0, burst=1.0)  # a one-token bucket: C4 waits for it to be full
    assert buckets.wait_for(0.5, single, names.C4_BACKGROUND) == pytest.approx(0.5)
    assert buckets.wait_for(0.5, single, names.C1_OWNER) == pytest.approx(0.5)


def test_bucket_overrides_are_checked_and_name_the_variable() -> None:
    merged = parse_buckets('{"telegram": {"recipient": {"rate": 0.5, "burst": 2}}}')
    assert merged["telegram"]["recipient"] == Bucket(0.5, 2.0)
    assert merged["telegram"]["account"] == Bucket(30.0, 30.0)
    for bad in ('{"sms": {}}', '{"telegram": {"account": {"rate": 0, "burst": 1}}}',
                '{"telegram": {"peer": {"rate": 1, "burst": 1}}}', "[1]", "{"):  # fmt: skip
        with pytest.raises(ConfigError, match="EVENTOS_CHANNELS_BUCKETS"):
            parse_buckets(bad)
    with pytest.raises(ConfigError, match="EVENTOS_CHANNELS_TELEGRAM_API"):
        ChannelSettings.from_env({"EVENTOS_CHANNELS_TELEGRAM_API": "ftp://x"})


def message(update_id: int, chat: dict[str, object], text: str = "hi") -> dict[str, object]:
    return {"update_id": update_id, "message": {"message_id": 7, "date": 1_790_000_000,
            "chat": chat, "from": {"id": 5, "first_name": "Ada"}, "text": text}}  # fmt: skip


def test_a_private_message_becomes_a_record_of_its_account_keyed_by_update_id() -> None:
    rec = update_record("telegram:tg-main", SALT, message(11, {"id": 4242, "type": "private"}))
    assert (rec.source_key, rec.dedupe_key, rec.status) == (
        "telegram:tg-main",
        "update:11",
        names.INGRESS_ACCEPTED,
    )
    env = rec.envelope or {}
    assert env["subject"] == thread_id(SALT, "telegram", "tg-main", "4242")
    assert env["data"]["reply_to"] == "4242" and env["data"]["text"] == "hi"
    assert names.GROUP_ATTRIBUTE not in env


def test_group_messages_are_marked_and_what_is_not_a_message_is_a_dead_row() -> None:
    rec = update_record("telegram:tg-main", SALT, message(12, {"id": -100, "type": "supergroup"}))
    assert (rec.envelope or {})[names.GROUP_ATTRIBUTE] == names.GROUP_CHAT
    odd = update_record("telegram:tg-main", SALT, {"update_id": 13, "poll": {"id": "x"}})
    assert (odd.status, odd.error) == (names.INGRESS_DEAD, "not a chat message")
    huge = update_record("telegram:tg-main", SALT,
                         message(14, {"id": 1, "type": "private"}, "x" * 70_000))  # fmt: skip
    assert huge.status == names.INGRESS_DEAD and "bytes" in str(huge.error)
    assert huge.size <= names.ENVELOPE_MAX_BYTES


def test_the_next_offset_confirms_the_page_and_an_empty_page_keeps_it() -> None:
    assert next_offset([{"update_id": 5}, {"update_id": 9}], 3) == 10
    assert next_offset([], 3) == 3
    assert next_offset([{"update_id": "x"}], None) is None
