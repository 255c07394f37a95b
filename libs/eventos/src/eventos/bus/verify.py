"""Webhook signature verification and provider dedupe keys (SPEC §3, §6.1), as pure functions.

Every comparison of a secret or signature is constant-time. Reasons in `SignatureInvalid` never
contain the secret or the signature that was sent.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from eventos.errors import ConfigError, SecretUnavailable, SignatureInvalid

_WHSEC_PREFIX = b"whsec_"
# int() refuses very long digit strings with ValueError; 12 digits reach the year 33658.
_MAX_TIMESTAMP_DIGITS = 12
CURRENT, PREVIOUS = "current", "previous"  # which value of a rotated secret verified a request


@dataclass(frozen=True)
class VerifyConfig:
    """How one webhook endpoint proves its requests are authentic."""

    scheme: str
    secret: bytes | None = field(repr=False)
    header: str | None = None
    tolerance_s: int = 300
    # The secret before a rotation, accepted within its overlap window (eventos.secret_files).
    previous: bytes | None = field(default=None, repr=False)


class BodyCheck:
    """A signature check fed the body chunk by chunk (the HMAC is computed as it arrives, so a
    large body is never buffered for it); `finish` raises SignatureInvalid unless it matches."""

    verified_with = CURRENT  # which value of the secret signed it, once `finish` accepted it

    def __init__(
        self,
        key: bytes | None = None,
        prefix: bytes = b"",
        accept: Callable[[bytes], bool] = lambda digest: True,
        reason: str = "signature does not match",
    ) -> None:
        self._mac = hmac.new(key, prefix, hashlib.sha256) if key is not None else None
        self._accept = accept
        self._reason = reason

    def update(self, chunk: bytes) -> None:
        if self._mac is not None:
            self._mac.update(chunk)

    def finish(self) -> None:
        if self._mac is not None and not self._accept(self._mac.digest()):
            raise SignatureInvalid(self._reason)


class EitherCheck(BodyCheck):
    """The checks of a rotated secret's current and previous values, fed the same body; the
    request is authentic if either accepts it (the current one's reason otherwise), and
    `verified_with` says which did."""

    def __init__(self, checks: list[tuple[str, BodyCheck]], refusal: SignatureInvalid) -> None:
        self._checks, self._refusal = checks, refusal
        self.verified_with = CURRENT

    def update(self, chunk: bytes) -> None:
        for _, check in self._checks:
            check.update(chunk)

    def finish(self) -> None:
        for which, check in self._checks:
            try:
                check.finish()
            except SignatureInvalid as exc:
                self._refusal = self._refusal if which != CURRENT else exc
                continue
            self.verified_with = which
            return
        raise self._refusal


def start_check(cfg: VerifyConfig, headers: Mapping[str, str], now: float) -> BodyCheck:
    """Check what the headers alone can tell (missing or malformed signature headers, a stale
    timestamp, a wrong header secret: SignatureInvalid before any body is read) and return the
    check the body is fed to. With a `previous` secret, a request signed with either value
    passes (every scheme; Stripe's and Standard Webhooks' several signatures a header still
    count each)."""
    start = _VERIFIERS.get(cfg.scheme)
    if start is None:
        raise ValueError(f"unknown verification scheme {cfg.scheme!r}")
    if cfg.previous is None or cfg.scheme == "none":
        return start(cfg, headers, now)
    checks: list[tuple[str, BodyCheck]] = []
    refusal: SignatureInvalid | None = None
    for which, secret in ((CURRENT, cfg.secret), (PREVIOUS, cfg.previous)):
        try:
            checks.append((which, start(replace(cfg, secret=secret, previous=None), headers, now)))
        except SignatureInvalid as exc:
            refusal = refusal or exc  # the current secret's reason is the one answered
        except SecretUnavailable:
            if which == CURRENT:
                raise
    if not checks:
        assert refusal is not None
        raise refusal
    return EitherCheck(checks, refusal or SignatureInvalid("signature does not match"))


def verify(cfg: VerifyConfig, headers: Mapping[str, str], body: bytes, now: float) -> None:
    """Raise SignatureInvalid(reason) unless the request is authentic."""
    check = start_check(cfg, headers, now)
    check.update(body)
    check.finish()


GITHUB_BODY_KEY = "body:"  # a GitHub delivery's dedupe key: this and its body's sha256


def provider_dedupe_key(
    scheme: str, headers: Mapping[str, str], body: bytes, digest: str | None = None
) -> str | None:
    """The provider's own event id used as dedupe key, or None when the provider gives none.

    Every key is one the signature covers, so a captured request sent again is a duplicate
    whatever its unsigned headers say. GitHub signs the body alone (its `X-GitHub-Delivery`
    is not signed, and no time is), so its key is the body's sha256 (`digest` when the
    caller has it): GitHub's own redelivery (same id, same body) is a duplicate as before, and
    so is a replay of the body under a new delivery id."""
    if scheme not in _VERIFIERS:
        raise ValueError(f"unknown verification scheme {scheme!r}")
    if scheme == "stripe":
        return _stripe_event_id(body)
    if scheme == "github":
        return GITHUB_BODY_KEY + (digest or hashlib.sha256(body).hexdigest())
    if scheme == "standard-webhooks":
        return headers.get("webhook-id") or None
    if scheme == "whatsapp-business":
        return _whatsapp_key(body)
    return None


def secret_headers(cfg: VerifyConfig) -> frozenset[str]:
    """Lower-cased names of headers that carry the secret or signature (never stored)."""
    if cfg.scheme in ("header", "hmac-sha256"):
        return frozenset({_header_name(cfg)})
    names = _SECRET_HEADERS.get(cfg.scheme)
    if names is None:
        raise ValueError(f"unknown verification scheme {cfg.scheme!r}")
    return names


# --- schemes ---------------------------------------------------------------------------------


def _verify_none(cfg: VerifyConfig, headers: Mapping[str, str], now: float) -> BodyCheck:
    """Trusted internal callers; the spec only allows this together with a dedupe header."""
    return BodyCheck()


def _verify_header(cfg: VerifyConfig, headers: Mapping[str, str], now: float) -> BodyCheck:
    name = _header_name(cfg)
    given = _required(headers, name)
    # Header values arrive as str; compare their UTF-8 bytes with the secret bytes.
    if not hmac.compare_digest(given.encode("utf-8", "replace"), _secret(cfg)):
        raise SignatureInvalid(f"header {name} does not match the secret")
    return BodyCheck()


def _verify_hmac_sha256(cfg: VerifyConfig, headers: Mapping[str, str], now: float) -> BodyCheck:
    given = _required(headers, _header_name(cfg)).strip().lower().removeprefix("sha256=")
    return BodyCheck(_secret(cfg), accept=lambda digest: _same(given, digest.hex()))


def _verify_hub_signature(cfg: VerifyConfig, headers: Mapping[str, str], now: float) -> BodyCheck:
    """GitHub and Meta (WhatsApp Business) both send `X-Hub-Signature-256: sha256=<hex>`."""
    algorithm, sep, given = _required(headers, "x-hub-signature-256").strip().partition("=")
    if not sep or algorithm.lower() != "sha256":
        raise SignatureInvalid("malformed header x-hub-signature-256")
    return BodyCheck(_secret(cfg), accept=lambda digest: _same(given.lower(), digest.hex()))


def _verify_stripe(cfg: VerifyConfig, headers: Mapping[str, str], now: float) -> BodyCheck:
    timestamp, candidates = _stripe_signature(_required(headers, "stripe-signature"))
    _check_fresh(int(timestamp), now, cfg.tolerance_s)
    # Signed with the timestamp text exactly as sent, not a re-rendered number.
    return BodyCheck(_secret(cfg), f"{timestamp}.".encode(),
                     lambda digest: _any_same(candidates, digest.hex()),
                     "no v1 signature matches")  # fmt: skip


def _verify_standard_webhooks(
    cfg: VerifyConfig, headers: Mapping[str, str], now: float
) -> BodyCheck:
    """Standard Webhooks: base64 HMAC-SHA256 of `<webhook-id>.<timestamp>.<body>` in any `v1,`
    item of `webhook-signature`; the timestamp checked here against `now` (the reference
    library reads the wall clock with a fixed tolerance). The tests sign with that library."""
    msg_id = _required(headers, "webhook-id")
    timestamp = _unix_seconds(_required(headers, "webhook-timestamp"))
    signatures = _required(headers, "webhook-signature")
    if timestamp is None:
        raise SignatureInvalid("malformed header webhook-timestamp")
    _check_fresh(timestamp, now, cfg.tolerance_s)
    given = []
    for item in signatures.split():
        version, _, encoded = item.partition(",")
        decoded = _b64decode(encoded) if version == "v1" else None
        if decoded is not None:
            given.append(decoded)

    def accept(digest: bytes) -> bool:
        matched = False
        for candidate in given:
            matched |= hmac.compare_digest(candidate, digest)
        return matched

    key = _standard_webhooks_key(_secret(cfg))
    prefix = f"{msg_id}.{timestamp}.".encode("utf-8", "surrogateescape")
    return BodyCheck(key, prefix, accept, "no v1 signature matches")


_Verifier = Callable[[VerifyConfig, Mapping[str, str], float], BodyCheck]

_VERIFIERS: dict[str, _Verifier] = {
    "header": _verify_header,
    "hmac-sha256": _verify_hmac_sha256,
    "stripe": _verify_stripe,
    "github": _verify_hub_signature,
    "standard-webhooks": _verify_standard_webhooks,
    "whatsapp-business": _verify_hub_signature,
    "none": _verify_none,
}

_SECRET_HEADERS: dict[str, frozenset[str]] = {
    "stripe": frozenset({"stripe-signature"}),
    "github": frozenset({"x-hub-signature-256", "x-hub-signature"}),
    "standard-webhooks": frozenset({"webhook-signature"}),
    "whatsapp-business": frozenset({"x-hub-signature-256"}),
    "none": frozenset(),
}


# --- helpers ---------------------------------------------------------------------------------


def _secret(cfg: VerifyConfig) -> bytes:
    # An empty secret would let an empty header pass; answer 503 (the provider retries) not 401.
    if not cfg.secret:
        raise SecretUnavailable(f"the secret for scheme {cfg.scheme} is empty")
    return cfg.secret


def _header_name(cfg: VerifyConfig) -> str:
    if not cfg.header:
        raise ConfigError(f"scheme {cfg.scheme} needs the header that carries it")
    return cfg.header.lower()


def _required(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if not value:
        raise SignatureInvalid(f"missing header {name}")
    return value


def _hex_hmac(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    # compare_digest refuses non-ASCII str, and a header may hold anything.
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def _any_same(candidates: list[str], expected: str) -> bool:
    matched = False
    for candidate in candidates:
        matched |= _same(candidate.lower(), expected)
    return matched


def _unix_seconds(text: str) -> int | None:
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > _MAX_TIMESTAMP_DIGITS:
        return None
    return int(text)


def _check_fresh(timestamp: int, now: float, tolerance_s: int) -> None:
    if abs(now - timestamp) > tolerance_s:
        raise SignatureInvalid("timestamp outside tolerance")


def _stripe_signature(value: str) -> tuple[str, list[str]]:
    """Parse `t=<ts>,v1=<hex>[,v1=…][,v0=…]` into the timestamp text and the v1 signatures."""
    timestamp: str | None = None
    candidates: list[str] = []
    for item in value.split(","):
        key, sep, text = item.strip().partition("=")
        if not sep or (key == "t" and timestamp is not None):
            raise SignatureInvalid("malformed header stripe-signature")
        if key == "t":
            timestamp = text
        elif key == "v1":
            candidates.append(text)
    if timestamp is None or _unix_seconds(timestamp) is None or not candidates:
        raise SignatureInvalid("malformed header stripe-signature")
    return timestamp, candidates


def _standard_webhooks_key(secret: bytes) -> bytes:
    """`whsec_<base64>` is decoded strictly; any other secret is used as the raw key bytes.

    The library's own decoding drops characters outside the base64 alphabet, which would turn a
    mistyped secret into a different key and every request into a silent 401.
    """
    if not secret.startswith(_WHSEC_PREFIX):
        return secret
    key = _b64decode(secret.removeprefix(_WHSEC_PREFIX).decode("ascii", "replace"))
    if not key:
        raise SecretUnavailable("the standard-webhooks secret is not base64 after whsec_")
    return key


def _b64decode(text: str) -> bytes | None:
    padded = text + "=" * (-len(text) % 4)  # senders may drop the padding
    try:
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        return None


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def _stripe_event_id(body: bytes) -> str | None:
    payload = _json(body)
    event_id = payload.get("id") if isinstance(payload, dict) else None
    return event_id if isinstance(event_id, str) and event_id else None


def _whatsapp_key(body: bytes) -> str | None:
    """Sorted, comma-joined ids of the messages and statuses in a Meta webhook.

    Meta sends `sent`, `delivered` and `read` for one message as separate webhooks that carry the
    same wamid, so a status id is suffixed with its status; otherwise `read` would be dropped as a
    duplicate of `delivered`.
    """
    ids: set[str] = set()
    for value in _whatsapp_values(_json(body)):
        for message in _dicts(value.get("messages")):
            if _nonempty_str(message.get("id")):
                ids.add(message["id"])
        for status in _dicts(value.get("statuses")):
            if _nonempty_str(status.get("id")):
                state = status.get("status")
                ids.add(f"{status['id']}:{state}" if _nonempty_str(state) else status["id"])
    return ",".join(sorted(ids)) or None


def _whatsapp_values(payload: Any) -> Iterator[dict[str, Any]]:
    if not isinstance(payload, dict):
        return
    for entry in _dicts(payload.get("entry")):
        for change in _dicts(entry.get("changes")):
            value = change.get("value")
            if isinstance(value, dict):
                yield value


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value)
