"""A rotated webhook secret: every scheme accepts a request signed with the previous value
while it is offered (the overlap window), says which value verified it, and refuses a request
signed with neither, with the current secret's reason."""

from __future__ import annotations

import hashlib
import hmac
import time

import pytest
from signing import signed

from eventos.bus.verify import CURRENT, PREVIOUS, VerifyConfig, start_check, verify
from eventos.errors import SignatureInvalid

BODY = b'{"id": "evt_rot_1", "object": "event"}'
NEW, OLD, OTHER = "new-secret-value-1", "old-secret-value-0", "some-other-value-2"
SCHEMES = ("header", "hmac-sha256", "stripe", "github", "standard-webhooks", "whatsapp-business")
HEADERS = {"header": "X-Token", "hmac-sha256": "X-Signature"}


def config(scheme: str, previous: str | None) -> VerifyConfig:
    return VerifyConfig(scheme, NEW.encode(), HEADERS.get(scheme), 300,
                        previous.encode() if previous else None)  # fmt: skip


def check(scheme: str, secret: str, previous: str | None = OLD) -> str:
    """Which value verified a request signed with `secret`."""
    headers = {k.lower(): v for k, v in signed(scheme, secret, BODY, "evt_rot_1").items()}
    body_check = start_check(config(scheme, previous), headers, time.time())
    body_check.update(BODY)
    body_check.finish()
    return body_check.verified_with


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_previous_secret_passes_while_it_is_offered_and_says_so(scheme: str) -> None:
    assert check(scheme, NEW) == CURRENT
    assert check(scheme, OLD) == PREVIOUS


@pytest.mark.parametrize("scheme", SCHEMES)
def test_once_the_window_is_over_only_the_new_secret_passes(scheme: str) -> None:
    assert check(scheme, NEW, previous=None) == CURRENT
    with pytest.raises(SignatureInvalid):
        check(scheme, OLD, previous=None)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_request_signed_with_neither_is_refused_with_the_current_reason(scheme: str) -> None:
    with pytest.raises(SignatureInvalid) as with_previous:
        check(scheme, OTHER)
    with pytest.raises(SignatureInvalid) as without:
        check(scheme, OTHER, previous=None)
    assert str(with_previous.value) == str(without.value)


def test_stripe_signatures_of_both_secrets_in_one_header_still_pass() -> None:
    """Stripe, while it rolls a secret, sends a v1 signature for each value."""
    t = str(int(time.time()))
    sig = {s: hmac.new(s.encode(), f"{t}.".encode() + BODY, hashlib.sha256).hexdigest()
           for s in (OLD, NEW)}  # fmt: skip
    header = {"stripe-signature": f"t={t},v1={sig[OLD]},v1={sig[NEW]}"}
    verify(config("stripe", None), header, BODY, time.time())
    body_check = start_check(config("stripe", OLD), header, time.time())
    body_check.update(BODY)
    body_check.finish()
    assert body_check.verified_with == CURRENT


def test_a_tampered_body_is_refused_under_either_secret() -> None:
    headers = {k.lower(): v for k, v in signed("hmac-sha256", OLD, BODY, "x").items()}
    with pytest.raises(SignatureInvalid):
        verify(config("hmac-sha256", OLD), headers, BODY + b" ", time.time())
