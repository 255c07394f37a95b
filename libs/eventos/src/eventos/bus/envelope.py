"""CloudEvents envelopes (SPEC §6.1 step 4): build them for HTTP events, check drivers' ones."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from eventos import names
from eventos.bus.jsonsafe import REASON_NOT_JSON, loads_storable
from eventos.errors import EventRejected

# Headers worth keeping; never authorization, cookie, proxy-authorization or a secret header.
HEADER_ALLOWLIST = frozenset(
    {
        "content-type",
        "user-agent",
        "x-github-event",
        "x-github-delivery",
        "x-github-hook-id",
        "webhook-id",
        "webhook-timestamp",
        "x-request-id",
        "x-event-type",
    }
)
NEVER_KEPT = frozenset({"authorization", "cookie", "proxy-authorization", "set-cookie"})
REQUIRED_ATTRIBUTES = ("specversion", "id", "source", "type")
HEADER_VALUE_MAX = 1024  # kept header values are cut here, so headers never crowd out the body


def kept_headers(
    headers: Mapping[str, str], *, extra: Iterable[str] = (), secret: Iterable[str] = ()
) -> dict[str, str]:
    """The allowlisted headers (plus `extra`), minus every secret-bearing header."""
    allowed = (
        (HEADER_ALLOWLIST | {h.lower() for h in extra}) - NEVER_KEPT - {h.lower() for h in secret}
    )
    return {k: v[:HEADER_VALUE_MAX] for k, v in headers.items() if k.lower() in allowed}


def new_event_id() -> str:
    return uuid.uuid4().hex


def http_envelope(
    *,
    path: str,
    event_type: str,
    headers: dict[str, str],
    body: object,
    event_id: str,
    body_ref: str | None = None,
) -> dict[str, Any]:
    """A CloudEvents 1.0 envelope for an HTTP event; `data` holds kept headers and the body."""
    data: dict[str, Any] = {"headers": headers}
    if body_ref is None:
        data["body"] = body
    else:
        data["preview"] = body
        data["body_ref"] = body_ref
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": f"/hooks/{path}",
        "type": event_type,
        "time": datetime.now(UTC).isoformat(),
        "datacontenttype": "application/json",
        "data": data,
    }


def encoded_size(envelope: Mapping[str, Any]) -> int:
    return len(json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode())


def check_driver_envelope(raw: bytes, *, by_reference: bool) -> dict[str, Any] | None:
    """Decode a driver's envelope; EventRejected names what is wrong with it."""
    if not raw:
        if by_reference:
            return None
        raise EventRejected("envelope is empty and there is no body_ref")
    if len(raw) > names.ENVELOPE_MAX_BYTES:
        # Nothing over 64 KB enters the bus inline (I7); a larger body travels as body_ref.
        raise EventRejected(f"envelope is {len(raw)} bytes, over 64 KB")
    # Storable or rejected here: NUL, a lone surrogate or deep nesting is this event's fault
    # and must never fail the batch it travels in (iterative checks, no RecursionError).
    doc, fault = loads_storable(raw)
    if fault is not None:
        raise EventRejected(f"envelope is {fault}" if fault == REASON_NOT_JSON else
                            f"envelope {fault}")  # fmt: skip
    if not isinstance(doc, dict):
        raise EventRejected("envelope must be a JSON object")
    missing = [a for a in REQUIRED_ATTRIBUTES if not isinstance(doc.get(a), str) or not doc.get(a)]
    if missing:
        raise EventRejected(f"envelope lacks CloudEvents attributes: {', '.join(missing)}")
    if doc["specversion"] != "1.0":
        raise EventRejected("envelope specversion must be 1.0")
    return doc
