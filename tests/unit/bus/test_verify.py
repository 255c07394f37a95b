"""Webhook verification per scheme, with signatures computed the way each provider computes them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from eventos.bus.verify import (
    VerifyConfig,
    provider_dedupe_key,
    secret_headers,
    start_check,
    verify,
)
from eventos.errors import ConfigError, SecretUnavailable, SignatureInvalid

NOW = 1_700_000_000
BODY = b'{"id": "evt_1NqXyZ", "type": "invoice.paid", "amount": 1200}'
TAMPERED = b'{"id": "evt_1NqXyZ", "type": "invoice.paid", "amount": 9999}'
SECRET = b"s3cr3t-value"
WRONG = b"not-the-secret"


def hex_hmac(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def rejects(cfg: VerifyConfig, headers: dict[str, str], body: bytes, now: float = NOW) -> str:
    with pytest.raises(SignatureInvalid) as caught:
        verify(cfg, headers, body, now)
    return str(caught.value)


# --- header ------------------------------------------------------------------------------------

HEADER_CFG = VerifyConfig(scheme="header", secret=SECRET, header="X-Api-Token")


def test_header_matching_secret_passes() -> None:
    verify(HEADER_CFG, {"x-api-token": SECRET.decode()}, BODY, NOW)


def test_header_with_any_body_passes_because_only_the_header_is_checked() -> None:
    verify(HEADER_CFG, {"x-api-token": SECRET.decode()}, TAMPERED, NOW)


def test_header_missing_is_rejected_with_its_name() -> None:
    assert rejects(HEADER_CFG, {"x-other": SECRET.decode()}, BODY) == "missing header x-api-token"


def test_header_wrong_secret_is_rejected() -> None:
    assert "does not match" in rejects(HEADER_CFG, {"x-api-token": WRONG.decode()}, BODY)


def test_header_prefix_of_secret_is_rejected() -> None:
    rejects(HEADER_CFG, {"x-api-token": SECRET.decode()[:-1]}, BODY)


def test_header_non_ascii_value_is_rejected_not_crashing() -> None:
    rejects(HEADER_CFG, {"x-api-token": "sëcret"}, BODY)


def test_header_empty_secret_is_unavailable_not_a_pass() -> None:
    cfg = VerifyConfig(scheme="header", secret=b"", header="X-Api-Token")
    with pytest.raises(SecretUnavailable):
        verify(cfg, {"x-api-token": "x"}, BODY, NOW)


def test_header_scheme_without_header_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        verify(VerifyConfig(scheme="header", secret=SECRET), {}, BODY, NOW)


# --- hmac-sha256 -------------------------------------------------------------------------------

HMAC_CFG = VerifyConfig(scheme="hmac-sha256", secret=SECRET, header="X-Signature")


def test_hmac_plain_hex_passes() -> None:
    verify(HMAC_CFG, {"x-signature": hex_hmac(SECRET, BODY)}, BODY, NOW)


def test_hmac_prefixed_upper_case_hex_passes() -> None:
    verify(HMAC_CFG, {"x-signature": "sha256=" + hex_hmac(SECRET, BODY).upper()}, BODY, NOW)


def test_hmac_tampered_body_is_rejected() -> None:
    assert rejects(HMAC_CFG, {"x-signature": hex_hmac(SECRET, BODY)}, TAMPERED) == (
        "signature does not match"
    )


def test_hmac_missing_header_is_rejected() -> None:
    assert rejects(HMAC_CFG, {}, BODY) == "missing header x-signature"


def test_hmac_wrong_secret_is_rejected() -> None:
    rejects(HMAC_CFG, {"x-signature": hex_hmac(WRONG, BODY)}, BODY)


# --- stripe ------------------------------------------------------------------------------------

STRIPE_CFG = VerifyConfig(scheme="stripe", secret=b"whsec_stripe_test", tolerance_s=300)


def stripe_header(secret: bytes, body: bytes, t: int, extra: str = "") -> str:
    return f"t={t},v1={hex_hmac(secret, f'{t}.'.encode() + body)}{extra}"


def test_stripe_valid_signature_passes() -> None:
    headers = {"stripe-signature": stripe_header(b"whsec_stripe_test", BODY, NOW)}
    verify(STRIPE_CFG, headers, BODY, NOW + 10)


def test_stripe_passes_when_any_v1_matches() -> None:
    good = hex_hmac(b"whsec_stripe_test", f"{NOW}.".encode() + BODY)
    headers = {"stripe-signature": f"t={NOW},v1={'0' * 64},v1={good},v0={'1' * 64}"}
    verify(STRIPE_CFG, headers, BODY, NOW)


def test_stripe_tampered_body_is_rejected() -> None:
    headers = {"stripe-signature": stripe_header(b"whsec_stripe_test", BODY, NOW)}
    assert rejects(STRIPE_CFG, headers, TAMPERED) == "no v1 signature matches"


def test_stripe_missing_header_is_rejected() -> None:
    assert rejects(STRIPE_CFG, {}, BODY) == "missing header stripe-signature"


def test_stripe_wrong_secret_is_rejected() -> None:
    headers = {"stripe-signature": stripe_header(WRONG, BODY, NOW)}
    assert rejects(STRIPE_CFG, headers, BODY) == "no v1 signature matches"


def test_stripe_stale_timestamp_is_rejected_even_when_signed() -> None:
    headers = {"stripe-signature": stripe_header(b"whsec_stripe_test", BODY, NOW - 301)}
    assert rejects(STRIPE_CFG, headers, BODY) == "timestamp outside tolerance"


def test_stripe_future_timestamp_is_rejected() -> None:
    headers = {"stripe-signature": stripe_header(b"whsec_stripe_test", BODY, NOW + 301)}
    assert rejects(STRIPE_CFG, headers, BODY) == "timestamp outside tolerance"


def test_stripe_timestamp_at_the_tolerance_edge_passes() -> None:
    headers = {"stripe-signature": stripe_header(b"whsec_stripe_test", BODY, NOW - 300)}
    verify(STRIPE_CFG, headers, BODY, NOW)


def test_stripe_only_v0_signature_is_rejected() -> None:
    v0 = hex_hmac(b"whsec_stripe_test", f"{NOW}.".encode() + BODY)
    assert "malformed" in rejects(STRIPE_CFG, {"stripe-signature": f"t={NOW},v0={v0}"}, BODY)


@pytest.mark.parametrize(
    "value",
    ["garbage", "t=abc,v1=00", "v1=00", f"t={NOW}", f"t={NOW},t={NOW},v1=00", f"t={NOW},v1"],
)
def test_stripe_malformed_header_is_rejected(value: str) -> None:
    assert "malformed" in rejects(STRIPE_CFG, {"stripe-signature": value}, BODY)


# --- github ------------------------------------------------------------------------------------

GITHUB_CFG = VerifyConfig(scheme="github", secret=SECRET)


def test_github_valid_signature_passes() -> None:
    headers = {"x-hub-signature-256": "sha256=" + hex_hmac(SECRET, BODY)}
    verify(GITHUB_CFG, headers, BODY, NOW)


def test_github_tampered_body_is_rejected() -> None:
    headers = {"x-hub-signature-256": "sha256=" + hex_hmac(SECRET, BODY)}
    assert rejects(GITHUB_CFG, headers, TAMPERED) == "signature does not match"


def test_github_missing_header_is_rejected() -> None:
    sha1 = "sha1=" + hmac.new(SECRET, BODY, hashlib.sha1).hexdigest()
    assert rejects(GITHUB_CFG, {"x-hub-signature": sha1}, BODY) == (
        "missing header x-hub-signature-256"
    )


def test_github_wrong_secret_is_rejected() -> None:
    headers = {"x-hub-signature-256": "sha256=" + hex_hmac(WRONG, BODY)}
    rejects(GITHUB_CFG, headers, BODY)


def test_github_signature_without_prefix_is_rejected() -> None:
    headers = {"x-hub-signature-256": hex_hmac(SECRET, BODY)}
    assert "malformed" in rejects(GITHUB_CFG, headers, BODY)


# --- standard-webhooks -------------------------------------------------------------------------

SW_KEY = b"standard-webhooks-key-32-bytes!!"
SW_SECRET = "whsec_" + base64.b64encode(SW_KEY).decode()
SW_CFG = VerifyConfig(scheme="standard-webhooks", secret=SW_SECRET.encode(), tolerance_s=300)


def sw_headers(
    secret: str | bytes, body: bytes, t: int, msg_id: str = "msg_2abc"
) -> dict[str, str]:
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(t, tz=UTC), body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(t), "webhook-signature": signature}


def test_standard_webhooks_valid_signature_passes() -> None:
    verify(SW_CFG, sw_headers(SW_SECRET, BODY, NOW), BODY, NOW + 5)


def test_standard_webhooks_signature_matches_the_spec_construction() -> None:
    # Independent of the library: base64(HMAC-SHA256(key, "id.ts.body")).
    mac = hmac.new(SW_KEY, f"msg_2abc.{NOW}.".encode() + BODY, hashlib.sha256).digest()
    headers = {
        "webhook-id": "msg_2abc",
        "webhook-timestamp": str(NOW),
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }
    verify(SW_CFG, headers, BODY, NOW)


def test_standard_webhooks_any_of_several_signatures_passes() -> None:
    headers = sw_headers(SW_SECRET, BODY, NOW)
    wrong = base64.b64encode(b"\0" * 32).decode()
    headers["webhook-signature"] = f"v1,{wrong} v1a,{wrong} {headers['webhook-signature']}"
    verify(SW_CFG, headers, BODY, NOW)


def test_standard_webhooks_tampered_body_is_rejected() -> None:
    assert rejects(SW_CFG, sw_headers(SW_SECRET, BODY, NOW), TAMPERED) == "no v1 signature matches"


@pytest.mark.parametrize("name", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_standard_webhooks_missing_header_is_rejected(name: str) -> None:
    headers = sw_headers(SW_SECRET, BODY, NOW)
    del headers[name]
    assert rejects(SW_CFG, headers, BODY) == f"missing header {name}"


def test_standard_webhooks_wrong_secret_is_rejected() -> None:
    other = "whsec_" + base64.b64encode(b"another-key-entirely").decode()
    assert rejects(SW_CFG, sw_headers(other, BODY, NOW), BODY) == "no v1 signature matches"


def test_standard_webhooks_other_message_id_is_rejected() -> None:
    headers = sw_headers(SW_SECRET, BODY, NOW)
    headers["webhook-id"] = "msg_other"
    rejects(SW_CFG, headers, BODY)


def test_standard_webhooks_stale_timestamp_is_rejected_against_injected_now() -> None:
    headers = sw_headers(SW_SECRET, BODY, NOW - 301)
    assert rejects(SW_CFG, headers, BODY) == "timestamp outside tolerance"


def test_standard_webhooks_uses_configured_tolerance_not_the_library_default() -> None:
    wide = VerifyConfig(scheme="standard-webhooks", secret=SW_SECRET.encode(), tolerance_s=900)
    verify(wide, sw_headers(SW_SECRET, BODY, NOW - 600), BODY, NOW)
    narrow = VerifyConfig(scheme="standard-webhooks", secret=SW_SECRET.encode(), tolerance_s=60)
    assert rejects(narrow, sw_headers(SW_SECRET, BODY, NOW - 61), BODY) == (
        "timestamp outside tolerance"
    )


def test_standard_webhooks_malformed_timestamp_is_rejected() -> None:
    headers = sw_headers(SW_SECRET, BODY, NOW)
    headers["webhook-timestamp"] = "1e9"
    assert "malformed" in rejects(SW_CFG, headers, BODY)


def test_standard_webhooks_raw_secret_without_prefix_is_the_key_itself() -> None:
    cfg = VerifyConfig(scheme="standard-webhooks", secret=b"plain raw secret!")
    verify(cfg, sw_headers(b"plain raw secret!", BODY, NOW), BODY, NOW)


def test_standard_webhooks_unpadded_whsec_secret_decodes() -> None:
    unpadded = SW_SECRET.rstrip("=")
    cfg = VerifyConfig(scheme="standard-webhooks", secret=unpadded.encode())
    verify(cfg, sw_headers(SW_SECRET, BODY, NOW), BODY, NOW)


def test_standard_webhooks_whsec_secret_that_is_not_base64_is_unavailable() -> None:
    cfg = VerifyConfig(scheme="standard-webhooks", secret=b"whsec_not base64!")
    with pytest.raises(SecretUnavailable):
        verify(cfg, sw_headers(SW_SECRET, BODY, NOW), BODY, NOW)


def test_standard_webhooks_checks_the_raw_bytes() -> None:
    # The HMAC runs over the bytes as they arrive (never a decoded copy): a body that is not
    # UTF-8 passes only when those exact bytes were signed.
    raw = b"\xff\xfe{}"
    mac = hmac.new(SW_KEY, f"msg_2abc.{NOW}.".encode() + raw, hashlib.sha256).digest()
    signed = {"webhook-id": "msg_2abc", "webhook-timestamp": str(NOW),
              "webhook-signature": "v1," + base64.b64encode(mac).decode()}  # fmt: skip
    verify(SW_CFG, signed, raw, NOW)
    assert rejects(SW_CFG, sw_headers(SW_SECRET, BODY, NOW), raw) == "no v1 signature matches"


def test_a_check_fed_in_chunks_equals_one_fed_whole() -> None:
    body = BODY * 1000
    check = start_check(SW_CFG, sw_headers(SW_SECRET, body, NOW), NOW)
    for i in range(0, len(body), 777):
        check.update(body[i : i + 777])
    check.finish()
    wrong = start_check(SW_CFG, sw_headers(SW_SECRET, body, NOW), NOW)
    wrong.update(body[:-1])
    with pytest.raises(SignatureInvalid):
        wrong.finish()


# --- whatsapp-business -------------------------------------------------------------------------

WA_SECRET = b"meta-app-secret"
WA_CFG = VerifyConfig(scheme="whatsapp-business", secret=WA_SECRET)
WA_BODY = json.dumps(
    {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": "1029384756",
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "messaging_product": "whatsapp",
                            "messages": [
                                {"id": "wamid.HBgLMB", "type": "text", "text": {"body": "hi"}},
                                {"id": "wamid.HBgLMA", "type": "text", "text": {"body": "yo"}},
                            ],
                        },
                    }
                ],
            }
        ],
    }
).encode()


def test_whatsapp_valid_signature_passes() -> None:
    headers = {"x-hub-signature-256": "sha256=" + hex_hmac(WA_SECRET, WA_BODY)}
    verify(WA_CFG, headers, WA_BODY, NOW)


def test_whatsapp_tampered_body_is_rejected() -> None:
    headers = {"x-hub-signature-256": "sha256=" + hex_hmac(WA_SECRET, WA_BODY)}
    assert rejects(WA_CFG, headers, WA_BODY.replace(b"hi", b"ho")) == "signature does not match"


def test_whatsapp_missing_header_is_rejected() -> None:
    assert rejects(WA_CFG, {}, WA_BODY) == "missing header x-hub-signature-256"


def test_whatsapp_wrong_secret_is_rejected() -> None:
    headers = {"x-hub-signature-256": "sha256=" + hex_hmac(WRONG, WA_BODY)}
    rejects(WA_CFG, headers, WA_BODY)


# --- none and unknown --------------------------------------------------------------------------


def test_none_always_passes() -> None:
    verify(VerifyConfig(scheme="none", secret=None), {}, b"", NOW)


def test_unknown_scheme_is_a_value_error() -> None:
    cfg = VerifyConfig(scheme="hmac-md5", secret=SECRET)
    with pytest.raises(ValueError):
        verify(cfg, {}, BODY, NOW)
    with pytest.raises(ValueError):
        secret_headers(cfg)
    with pytest.raises(ValueError):
        provider_dedupe_key("hmac-md5", {}, BODY)


# --- dedupe keys -------------------------------------------------------------------------------


def test_stripe_dedupe_key_is_the_event_id() -> None:
    assert provider_dedupe_key("stripe", {}, BODY) == "evt_1NqXyZ"


@pytest.mark.parametrize("body", [b"not json", b"\xff", b"[1, 2]", b'{"id": 7}', b"{}"])
def test_stripe_dedupe_key_is_none_without_an_id(body: bytes) -> None:
    assert provider_dedupe_key("stripe", {}, body) is None


def test_github_dedupe_key_is_the_signed_body_not_the_delivery_header() -> None:
    """X-GitHub-Delivery is not signed: a captured body under a new id has the same key."""
    key = "body:" + hashlib.sha256(BODY).hexdigest()
    for delivery in ("72d3162e-cc78-11e3-81ab-4c9367dc0958", "new-id"):
        assert provider_dedupe_key("github", {"x-github-delivery": delivery}, BODY) == key
    assert provider_dedupe_key("github", {}, BODY) == key
    assert provider_dedupe_key("github", {}, BODY + b" ") != key


def test_standard_webhooks_dedupe_key_is_the_webhook_id() -> None:
    assert provider_dedupe_key("standard-webhooks", {"webhook-id": "msg_2abc"}, BODY) == "msg_2abc"
    assert provider_dedupe_key("standard-webhooks", {}, BODY) is None


def test_whatsapp_dedupe_key_joins_sorted_message_ids() -> None:
    assert provider_dedupe_key("whatsapp-business", {}, WA_BODY) == "wamid.HBgLMA,wamid.HBgLMB"


def test_whatsapp_status_updates_of_one_message_have_distinct_keys() -> None:
    def status_body(status: str) -> bytes:
        value = {"statuses": [{"id": "wamid.OUT1", "status": status, "recipient_id": "49151"}]}
        return json.dumps({"entry": [{"changes": [{"value": value}]}]}).encode()

    delivered = provider_dedupe_key("whatsapp-business", {}, status_body("delivered"))
    read = provider_dedupe_key("whatsapp-business", {}, status_body("read"))
    assert delivered == "wamid.OUT1:delivered"
    assert read == "wamid.OUT1:read"


@pytest.mark.parametrize(
    "body",
    [b"{", b'{"entry": "x"}', b'{"entry": [{"changes": [{"value": {"contacts": []}}]}]}'],
)
def test_whatsapp_dedupe_key_is_none_without_ids(body: bytes) -> None:
    assert provider_dedupe_key("whatsapp-business", {}, body) is None


@pytest.mark.parametrize("scheme", ["header", "hmac-sha256", "none"])
def test_generic_schemes_have_no_provider_dedupe_key(scheme: str) -> None:
    assert provider_dedupe_key(scheme, {"webhook-id": "x", "x-github-delivery": "y"}, BODY) is None


# --- secret headers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (HEADER_CFG, {"x-api-token"}),
        (HMAC_CFG, {"x-signature"}),
        (STRIPE_CFG, {"stripe-signature"}),
        (GITHUB_CFG, {"x-hub-signature-256", "x-hub-signature"}),
        (SW_CFG, {"webhook-signature"}),
        (WA_CFG, {"x-hub-signature-256"}),
        (VerifyConfig(scheme="none", secret=None), set()),
    ],
)
def test_secret_headers_per_scheme(cfg: VerifyConfig, expected: set[str]) -> None:
    assert secret_headers(cfg) == frozenset(expected)
