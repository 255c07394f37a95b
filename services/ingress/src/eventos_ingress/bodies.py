"""Request bodies of the owner API: capped before they are read, then parsed strictly.

A body is refused with 413 when its `Content-Length` is over the operation's cap, before any
byte is read; otherwise it is streamed and the read stops at the cap (a false or absent length
cannot get more in). Parsed documents are checked whole: no NUL characters and no lone
surrogates (PostgreSQL text cannot hold them, and they are never meant), at most
`MAX_DEPTH` levels of nesting and `MAX_VALUES` values (a YAML alias bomb is small on the wire).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from eventos.errors import BodyTooLarge, InputInvalid

APPLY_BODY_MAX = 1024 * 1024  # employee specs: YAML or JSON, several documents
JSON_BODY_MAX = 64 * 1024  # every other operation (chat text itself is at most 32 KiB)
MAX_DEPTH = 64  # nesting levels of objects and arrays, the top level counting as 1
MAX_VALUES = 100_000  # values in one document, counting every visit of a shared YAML node
BODY = "(body)"


def _declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InputInvalid("Content-Length", "must be an integer") from None


def check_declared(request: Request, cap: int) -> None:
    """BodyTooLarge, before anything is read, when the declared length is over `cap`."""
    declared = _declared_length(request)
    if declared is not None and declared > cap:
        raise BodyTooLarge(f"the body is {declared} bytes; this operation takes at most {cap}")


async def read_capped(request: Request, cap: int) -> bytes:
    """The raw body, or BodyTooLarge: by its Content-Length first, then while streaming."""
    check_declared(request, cap)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(f"the body is over {cap} bytes, the cap of this operation")
        chunks.append(chunk)
    return b"".join(chunks)


def _where(path: str) -> str:
    return path or BODY


def check_text(value: str, path: str) -> None:
    """InputInvalid on `path` for a NUL character or a lone surrogate in `value`."""
    if "\x00" in value:
        raise InputInvalid(_where(path), "must not contain NUL characters (\\u0000)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputInvalid(_where(path), "must not contain lone surrogates") from None


def check_document(doc: object) -> None:
    """InputInvalid naming the first bad value's path (`a.b[2]`, `(body)` for the top)."""
    seen = 0
    stack: list[tuple[object, str, int]] = [(doc, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InputInvalid(BODY, f"more than {MAX_VALUES} values")
        if isinstance(value, str):
            check_text(value, path)
        elif isinstance(value, dict | list) and depth > MAX_DEPTH:
            raise InputInvalid(_where(path), f"nested deeper than {MAX_DEPTH} levels")
        elif isinstance(value, dict):
            for key, item in value.items():
                name = str(key)
                check_text(name, path)
                stack.append((item, f"{path}.{name}" if path else name, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> object:
    """Any JSON document, strictly (no NaN or Infinity; depth, NUL and surrogates checked)."""
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise InputInvalid(BODY, f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, huge integers
        raise InputInvalid(BODY, f"not valid JSON: {exc}") from None
    check_document(doc)
    return doc


def json_object(raw: bytes) -> dict[str, Any]:
    """The body's JSON object; an empty body is an empty object."""
    if not raw.strip():
        return {}
    doc = parse_json(raw)
    if not isinstance(doc, dict):
        raise InputInvalid(BODY, "must be a JSON object")
    return doc


async def read_object(request: Request, cap: int = JSON_BODY_MAX) -> dict[str, Any]:
    """The capped body as a strict JSON object."""
    return json_object(await read_capped(request, cap))
