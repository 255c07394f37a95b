"""JSON that PostgreSQL can store and consumers can walk (SPEC §6.1 "verified but malformed").

`jsonb` refuses the NUL character (`\\u0000`), the client cannot encode a lone surrogate
(`\\ud800`) as UTF-8, and deep nesting exhausts a recursive reader's stack. Such a body is not
an outage: the caller stores it as `dead(malformed)` with the reason this module names.

Model output is not refused but repaired (`storable_text`, `storable_value`): a NUL or a lone
surrogate in a reply or a tool call's arguments becomes U+FFFD (REPLACEMENT CHARACTER, `�`)
before it is saved, so one odd token never fails a turn's save on every attempt.
"""

from __future__ import annotations

import json
import re
from typing import Any

from eventos import names

REASON_NOT_JSON = "not JSON"
REASON_DEPTH = f"nested deeper than {names.JSON_MAX_DEPTH}"
REASON_NUL = "holds a NUL character"
REASON_SURROGATE = "holds a lone surrogate"
REPLACEMENT = "\ufffd"  # what a character PostgreSQL cannot store becomes
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _text_fault(text: str) -> str | None:
    if "\x00" in text:
        return REASON_NUL
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return REASON_SURROGATE
    return None


def storable_fault(value: Any, max_depth: int = names.JSON_MAX_DEPTH) -> str | None:
    """Why a decoded JSON value cannot be stored as is, or None. Iterative: never recurses."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            fault = _text_fault(item)
        elif isinstance(item, dict | list):
            if depth > max_depth:
                return REASON_DEPTH
            children = item.items() if isinstance(item, dict) else enumerate(item)
            fault = None
            for key, child in children:
                if isinstance(key, str) and (fault := _text_fault(key)):
                    break
                if isinstance(child, str | dict | list):
                    stack.append((child, depth + 1))
        else:
            fault = None
        if fault:
            return fault
    return None


def loads_storable(raw: bytes | str) -> tuple[Any, str | None]:
    """Decode JSON; returns (value, None) or (None, the reason it is malformed)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        return None, REASON_DEPTH
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return None, REASON_NOT_JSON
    fault = storable_fault(value)
    return (None, fault) if fault else (value, None)


def safe_text(raw: bytes, limit: int) -> str:
    """At most `limit` bytes of `raw` as text PostgreSQL can store (for previews): invalid
    UTF-8 and NUL become U+FFFD."""
    return raw[:limit].decode("utf-8", "replace").replace("\x00", "\ufffd")


def storable_text(text: str) -> str:
    """The text with each NUL and lone surrogate replaced by U+FFFD (PostgreSQL's `text` and
    `jsonb` refuse the one, the wire encoding the other)."""
    if text.isascii() and "\x00" not in text:
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


def storable_value(value: Any, depth: int = 0) -> Any:
    """A decoded JSON value with every string (keys too) made `storable_text`. Past
    JSON_MAX_DEPTH a value is left as it is (the database refuses it as one record)."""
    if isinstance(value, str):
        return storable_text(value)
    if depth > names.JSON_MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {storable_text(str(k)): storable_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [storable_value(v, depth + 1) for v in value]
    return value
