"""Real signatures, computed the way each provider computes them (independently of verify.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from conftest import SECRETS
from standardwebhooks import Webhook


def _hex(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def stripe(body: bytes, *, ts: int | None = None, secret: str | None = None) -> dict[str, str]:
    t = str(ts if ts is not None else int(time.time()))
    key = secret or SECRETS["EVENTOS_SECRET_STRIPE_WHSEC"]
    return {"Stripe-Signature": f"t={t},v1={_hex(key, t.encode() + b'.' + body)}",
            "content-type": "application/json"}  # fmt: skip


def github(body: bytes, delivery: str) -> dict[str, str]:
    sig = _hex(SECRETS["EVENTOS_SECRET_GITHUB_HOOK"], body)
    return {"X-Hub-Signature-256": f"sha256={sig}", "X-GitHub-Delivery": delivery,
            "X-GitHub-Event": "push", "content-type": "application/json"}  # fmt: skip


def standard(body: bytes, msg_id: str, *, ts: int | None = None) -> dict[str, str]:
    when = ts if ts is not None else int(time.time())
    wh = Webhook(SECRETS["EVENTOS_SECRET_STD_HOOK"])
    from datetime import UTC, datetime

    sig = wh.sign(msg_id, datetime.fromtimestamp(when, tz=UTC), body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(when), "webhook-signature": sig,
            "content-type": "application/json"}  # fmt: skip


def meta(body: bytes) -> dict[str, str]:
    sig = _hex(SECRETS["EVENTOS_SECRET_META_APP"], body)
    return {"X-Hub-Signature-256": f"sha256={sig}", "content-type": "application/json"}


def deploy(body: bytes) -> dict[str, str]:
    return {"X-Signature": "sha256=" + _hex(SECRETS["EVENTOS_SECRET_DEPLOY_HOOK"], body),
            "content-type": "application/json"}  # fmt: skip


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def signed(scheme: str, secret: str, body: bytes, event_id: str) -> dict[str, str]:
    """Headers of a request to a webhook of `scheme` signed with `secret` (any value, for the
    rotation tests), its provider id `event_id` where the scheme carries one."""
    now = int(time.time())
    if scheme == "header":
        return {"X-Token": secret, "X-Request-Id": event_id}
    if scheme == "hmac-sha256":
        return {"X-Signature": "sha256=" + _hex(secret, body)}
    if scheme == "stripe":
        return stripe(body, ts=now, secret=secret)
    if scheme in ("github", "whatsapp-business"):
        return {"X-Hub-Signature-256": f"sha256={_hex(secret, body)}",
                "X-GitHub-Delivery": event_id, "content-type": "application/json"}  # fmt: skip
    if scheme == "standard-webhooks":
        from datetime import UTC, datetime

        key = secret if secret.startswith("whsec_") else secret.encode()  # raw bytes, as verify
        sig = Webhook(key).sign(event_id, datetime.fromtimestamp(now, tz=UTC), body.decode())
        return {"webhook-id": event_id, "webhook-timestamp": str(now), "webhook-signature": sig,
                "content-type": "application/json"}  # fmt: skip
    raise ValueError(f"no signer for {scheme!r}")
