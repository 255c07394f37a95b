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
