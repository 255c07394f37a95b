"""Opaque list cursors: the last row's sort key, as base64url JSON (nothing a client composes)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from eventos.errors import InputInvalid

CURSOR_MAX = 512  # characters; every cursor this package gives is far shorter


def encode(key: list[Any]) -> str:
    """The cursor of a sort key (strings, integers, ISO times)."""
    raw = json.dumps(key, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str, types: tuple[type, ...]) -> list[Any]:
    """The sort key of a cursor this package gave, checked against `types`; else InputInvalid."""
    bad = InputInvalid("cursor", "is not a cursor this list gave")
    if not cursor or len(cursor) > CURSOR_MAX or not cursor.isascii():
        raise bad
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise bad from None
    if not isinstance(key, list) or len(key) != len(types):
        raise bad
    for value, kind in zip(key, types, strict=True):
        if type(value) is not kind or (isinstance(value, str) and not _text(value)):
            raise bad
        if isinstance(value, int) and not -(2**63) <= value < 2**63:  # a bigint
            raise bad
    return key


def _text(value: str) -> bool:
    """Text the database takes: no NUL, no lone surrogate."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in value
