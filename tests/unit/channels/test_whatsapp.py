"""The WhatsApp driver's pure parts: the credential, a notification's entries, Graph errors."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from eventos import names
from eventos.channels.senders import Deferred, Held, Refused, Unclear
from eventos.channels.whatsapp import (
    CredentialInvalid,
    GraphError,
    Template,
    _outcome,
    parse_credential,
    read_notification,
)

GOOD = {"phone_number_id": "1234567890", "access_token": "EAAG-token", "app_secret": "s3cret",
        "verify_token": "vt"}  # fmt: skip
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SALT = b"s" * 32
ACCOUNT = "whatsapp_business:wa-main"


def cred(**extra: Any) -> Any:
    return parse_credential(json.dumps({**GOOD, **extra}).encode(), "wa-main")


def test_a_credential_has_defaults_and_an_optional_template() -> None:
    c = cred(template={"name": "follow_up", "language": "en_US"})
    assert c.messages_url == "https://graph.facebook.com/v21.0/1234567890/messages"
    assert c.template == Template("follow_up", "en_US")
    assert "EAAG" not in repr(c) and "s3cret" not in repr(c)


@pytest.mark.parametrize(("raw", "says"), [
    (b"EAAG-just-a-token", "must be JSON"),
    (b"[1]", "JSON object"),
    (json.dumps({**GOOD, "app_secret": ""}).encode(), "needs app_secret"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "verify_token"}).encode(),
     "needs verify_token"),
    (json.dumps({**GOOD, "phone_number_id": "+1 555"}).encode(), "must be digits"),
    (json.dumps({**GOOD, "graph_api": "ftp://x"}).encode(), "http(s) URL"),
    (json.dumps({**GOOD, "graph_version": "21"}).encode(), "v21.0"),
    (json.dumps({**GOOD, "template": {"name": "x"}}).encode(), "template must be"),
    (json.dumps({**GOOD, "token": "x"}).encode(), "unknown keys"),
])  # fmt: skip
def test_a_bad_credential_says_what_is_wrong_never_a_value(raw: bytes, says: str) -> None:
    with pytest.raises(CredentialInvalid, match=re.escape(says)) as info:
        parse_credential(raw, "wa-main")
    assert "s3cret" not in str(info.value) and "EAAG" not in str(info.value)


def notification(value: dict[str, Any], field: str = "messages") -> dict[str, Any]:
    value = {"messaging_product": "whatsapp",
             "metadata": {"display_phone_number": "1555", "phone_number_id": "1234567890"},
             **value}  # fmt: skip
    return {"object": "whatsapp_business_account",
            "entry": [{"id": "9", "changes": [{"field": field, "value": value}]}]}  # fmt: skip


def test_a_message_is_a_record_with_its_thread_and_window() -> None:
    ts = str(int((NOW - timedelta(minutes=1)).timestamp()))
    note = read_notification(ACCOUNT, SALT, cred(), notification({
        "contacts": [{"profile": {"name": "Ada"}, "wa_id": "4915100001"}],
        "messages": [{"from": "4915100001", "id": "wamid.A1", "timestamp": ts, "type": "text",
                      "text": {"body": "hi"}}]}), NOW)  # fmt: skip
    (rec,) = note.records
    assert rec.dedupe_key == "wamid:wamid.A1" and rec.status == names.INGRESS_ACCEPTED
    assert rec.envelope is not None and rec.envelope["data"]["name"] == "Ada"
    assert "4915100001" not in rec.envelope["subject"]
    (touch,) = note.windows
    assert touch.at == NOW - timedelta(minutes=1) and touch.wamid == "wamid.A1"
    assert "4915100001" not in touch.counterpart


def test_a_future_timestamp_never_holds_a_window_open() -> None:
    note = read_notification(ACCOUNT, SALT, cred(), notification({
        "messages": [{"from": "1", "id": "wamid.F", "timestamp": "99999999999", "type": "text",
                      "text": {"body": "from the future"}}]}), NOW)  # fmt: skip
    assert note.windows[0].at == NOW


def test_what_is_not_a_message_of_this_number_is_a_dead_row() -> None:
    other = notification({"messages": []})
    other["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"] = "999"
    for payload, why in [(None, "not a WhatsApp notification"),
                         ({"object": "page", "entry": []}, "not a WhatsApp notification"),
                         (other, "for another phone number"),
                         (notification({}, field="account_update"), "is not read")]:  # fmt: skip
        (rec,) = read_notification(ACCOUNT, SALT, cred(), payload, NOW).records
        assert rec.status == names.INGRESS_DEAD and why in str(rec.error)
        assert rec.dedupe_key.startswith("sha256:")


def test_statuses_are_receipts_not_records() -> None:
    note = read_notification(ACCOUNT, SALT, cred(), notification({"statuses": [
        {"id": "wamid.S", "status": "failed", "timestamp": "1700000000", "recipient_id": "1",
         "errors": [{"code": 131026, "title": "Message undeliverable\u0000"}]},
        {"id": "wamid.S", "status": "deleted"}, {"status": "read"}]}), NOW)  # fmt: skip
    assert note.records == []
    (receipt,) = note.receipts
    assert receipt.status == "failed"
    assert receipt.body["errors"] == [{"code": 131026, "title": "Message undeliverable"}]


@pytest.mark.parametrize(("status", "code", "outcome"), [
    (400, 130429, Deferred), (429, 131056, Deferred), (400, 131047, Held), (429, 80008, Deferred),
    (500, 131000, Unclear), (503, 2, Unclear), (401, 190, Refused), (400, 100, Refused),
])  # fmt: skip
def test_graph_errors_map_to_send_outcomes(status: int, code: int, outcome: type) -> None:
    result = _outcome(GraphError(status, code, "x"))
    assert isinstance(result, outcome)
    if code == 130429:
        assert isinstance(result, Deferred) and result.retry_after_s == 1.0
    if code == 131056:  # the pair rate: only this customer waits, the number is not paused
        assert isinstance(result, Deferred) and result.retry_after_s is None
    if code == 131047:
        assert isinstance(result, Held) and result.reason == names.HELD_WINDOW_CLOSED


def test_a_hostile_profile_name_is_cleaned_not_the_message_lost() -> None:
    note = read_notification(ACCOUNT, SALT, cred(), notification({
        "contacts": [{"profile": {"name": "Bo\u0000\ud800"}, "wa_id": "1"}],
        "messages": [{"from": "1", "id": "wamid.N", "timestamp": "1" * 40, "type": "text",
                      "text": {"body": "hello"}}]}), NOW)  # fmt: skip
    (rec,) = note.records
    assert rec.status == names.INGRESS_ACCEPTED and rec.envelope is not None
    assert rec.envelope["data"]["name"] == "Bo?" and rec.envelope["data"]["timestamp"] is None
