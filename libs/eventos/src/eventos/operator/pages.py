"""Pages of the operator lists: `?limit=` (default 50, at most 200) and an opaque `?cursor=`.

A cursor is the last row's sort key as base64url JSON; it is opaque to callers, and checked
here as strictly as any other input (a forged or garbled one is a 400, never a 500).
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime

from eventos.errors import InputInvalid

PAGE_DEFAULT = 50
PAGE_MAX = 200
CURSOR_MAX_CHARS = 200
CURSOR = "cursor"


def page_limit(raw: str | None) -> int:
    """The page size from `?limit=`: 1..200, 50 when absent."""
    if raw is None:
        return PAGE_DEFAULT
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw[:4]) <= PAGE_MAX:
        raise InputInvalid("limit", f"must be an integer in 1..{PAGE_MAX}")
    return int(raw)


def encode_cursor(key: list[str | int]) -> str:
    """The cursor of a sort key."""
    raw = json.dumps(key, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(raw: str | None, shape: tuple[type, ...]) -> list[str | int] | None:
    """The sort key of a cursor of this shape (types in order); None when absent."""
    if raw is None:
        return None
    try:
        if len(raw) > CURSOR_MAX_CHARS:
            raise ValueError("too long")
        key = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InputInvalid(CURSOR, "is not a cursor this list gave") from None
    if not isinstance(key, list) or len(key) != len(shape):
        raise InputInvalid(CURSOR, "is not a cursor this list gave")
    for value, kind in zip(key, shape, strict=True):
        if type(value) is not kind or (isinstance(value, int) and not 0 <= value < 2**63):
            raise InputInvalid(CURSOR, "is not a cursor this list gave")
    return key


def parse_time(key: str, raw: str | None) -> datetime | None:
    """An ISO 8601 time with its offset (`2025-01-31T08:00:00+01:00`, `…Z`); None when absent."""
    if raw is None:
        return None
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise InputInvalid(key, "must be an ISO 8601 time with an offset") from None
    if when.tzinfo is None:
        raise InputInvalid(key, "must carry its offset (Z or ±HH:MM)")
    return when
