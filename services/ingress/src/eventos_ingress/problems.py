"""RFC 9457 problem details for every refusal under `/v1/`: one stable `type` URI per kind.

Domain errors become HTTP answers here, once (STYLE: the edges translate once).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

from starlette.responses import Response

from eventos.errors import (
    BodyTooLarge,
    Conflict,
    DatabaseUnavailable,
    EventOSError,
    EventRejected,
    Forbidden,
    Gone,
    InputInvalid,
    NotFound,
    QueueFull,
    SpecInvalid,
    Unauthenticated,
)

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://eventos.dev/problems/"
RETRY_AFTER_S = 5  # a database outage: ask again soon (the pool reconnects meanwhile)
BODY_PATH = "(body)"  # the `errors[].path` of a problem with the body as a whole
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kind:
    """A kind of problem: its stable type URI, its status and its title."""

    slug: str
    status: int
    title: str

    @property
    def type(self) -> str:
        return TYPE_BASE + self.slug


INVALID_REQUEST = Kind("invalid-request", 400, "The request is invalid")
INVALID_SPEC = Kind("invalid-spec", 400, "The employee spec is invalid")
UNAUTHORIZED = Kind("unauthorized", 401, "A valid bearer token is required")
FORBIDDEN = Kind("forbidden", 403, "This token may not do that")
NOT_FOUND = Kind("not-found", 404, "Not found")
METHOD_NOT_ALLOWED = Kind("method-not-allowed", 405, "Method not allowed")
CONFLICT = Kind("conflict", 409, "The request conflicts with the current state")
GONE = Kind("gone", 410, "No longer kept")
BODY_TOO_LARGE = Kind("body-too-large", 413, "The request body is over its cap")
QUEUE_FULL = Kind("queue-full", 429, "The queue is full")
INTERNAL = Kind("internal-error", 500, "Internal error")
DATABASE_UNAVAILABLE = Kind("database-unavailable", 503, "The database is unavailable")
KINDS = [INVALID_REQUEST, INVALID_SPEC, UNAUTHORIZED, FORBIDDEN, NOT_FOUND, METHOD_NOT_ALLOWED,
         CONFLICT, GONE, BODY_TOO_LARGE, QUEUE_FULL, INTERNAL, DATABASE_UNAVAILABLE]  # fmt: skip

# Most specific first: InputInvalid and BodyTooLarge are EventRejected too.
_BY_ERROR: list[tuple[type[EventOSError], Kind]] = [
    (SpecInvalid, INVALID_SPEC), (BodyTooLarge, BODY_TOO_LARGE), (EventRejected, INVALID_REQUEST),
    (Unauthenticated, UNAUTHORIZED), (Forbidden, FORBIDDEN), (NotFound, NOT_FOUND),
    (Conflict, CONFLICT), (Gone, GONE), (QueueFull, QUEUE_FULL),
    (DatabaseUnavailable, DATABASE_UNAVAILABLE),
]  # fmt: skip


def problem(
    kind: Kind,
    detail: str,
    *,
    errors: list[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """An `application/problem+json` answer of this kind."""
    doc: dict[str, object] = {"type": kind.type, "title": kind.title, "status": kind.status,
                              "detail": detail}  # fmt: skip
    if errors is not None:
        doc["errors"] = [{"path": p, "message": m} for p, m in errors]
    body = json.dumps(doc, ensure_ascii=False).encode()
    return Response(body, status_code=kind.status, headers=headers, media_type=MEDIA_TYPE)


def from_error(exc: EventOSError) -> Response:
    """Domain error → problem (translated once, here); anything unforeseen is a 500."""
    kind = next((k for t, k in _BY_ERROR if isinstance(exc, t)), None)
    if kind is None:
        log.error("unexpected error on the owner API", exc_info=exc)
        return problem(INTERNAL, "unexpected error; see the ingress log")
    headers = None
    if kind is DATABASE_UNAVAILABLE:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
    elif kind is UNAUTHORIZED:
        headers = {"WWW-Authenticate": "Bearer"}
    elif isinstance(exc, QueueFull) and exc.retry_after_s is not None:
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    errors = None
    if isinstance(exc, SpecInvalid | InputInvalid):
        errors = exc.errors
    elif kind is INVALID_REQUEST:
        errors = [(BODY_PATH, str(exc))]
    return problem(kind, str(exc), errors=errors, headers=headers)


def not_found(detail: str) -> Response:
    """404 for a path nothing serves."""
    return problem(NOT_FOUND, detail)


def method_not_allowed(allowed: list[str]) -> Response:
    """405 with the methods the path does serve."""
    detail = f"use {', '.join(allowed)}"
    return problem(METHOD_NOT_ALLOWED, detail, headers={"Allow": ", ".join(allowed)})
