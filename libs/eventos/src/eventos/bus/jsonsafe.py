"""JSON that PostgreSQL can store and consumers can walk (SPEC §6.1 "verified but malformed").

`jsonb` refuses the NUL character (`\\u0000`), the client cannot encode a lone surrogate
(`\\ud800`) as UTF-8, and deep nesting exhausts a recursive reader's stack. Such a body is not
an outage: the caller stores it as `dead(malformed)` with the reason this module names.
"""

from __future__ import annotations

import json
from typing import Any

from eventos import names

REASON_NOT_JSON = "not JSON"
REASON_DEPTH = f"nested deeper than {names.JSON_MAX_DEPTH}"
REASON_NUL = "holds a NUL character"
REASON_SURROGATE = "holds a lone surrogate"


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
