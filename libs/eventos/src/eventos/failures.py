"""Why something failed, as its operator reads it: the innermost cause's type, a category and a
bounded message with credentials and content removed (issue 26, point 1).

Temporal wraps a failure on its way up: a turn's child error holds the step's `ActivityError`
("Activity task failed"), which holds the provider's `ApplicationError`. Only the innermost
cause says why, so every reader walks the `.cause` chain (`innermost`) and keeps that one.

Categories (`CATEGORIES`) are a closed set, safe for metrics and telemetry (EG15: categories,
never messages): `auth`, `quota`, `rate`, `outage`, `invalid_request`, `timeout`, `bug`. An
error type this module does not know, or an exception it cannot place, is a `bug`.

The message is the cause's own text, redacted (`eventos.telemetry.redact`: tokens, keys,
passwords), with quoted runs longer than `QUOTE_MAX` characters (where an error quotes a
message, a prompt or a row) cut to `'…'`, on one line, at most `MESSAGE_MAX` characters.
Pure: safe in workflow code (it reads the failure it is given, nothing else).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from temporalio.exceptions import ApplicationError, FailureError
from temporalio.exceptions import TimeoutError as TemporalTimeout
from temporalio.service import RPCError, RPCStatusCode

from eventos import names
from eventos.telemetry.redact import redact

AUTH: Final = "auth"
QUOTA: Final = "quota"
RATE: Final = "rate"
OUTAGE: Final = "outage"
INVALID_REQUEST: Final = "invalid_request"
TIMEOUT: Final = "timeout"
BUG: Final = "bug"
CATEGORIES: Final = (AUTH, QUOTA, RATE, OUTAGE, INVALID_REQUEST, TIMEOUT, BUG)

MESSAGE_MAX: Final = 300
QUOTE_MAX: Final = 40
CHAIN_MAX: Final = 16  # causes walked at most (a chain is short; a cycle must not hang)

# Error types raised by this code base (ApplicationError.type), by category.
TYPE_CATEGORIES: Final[dict[str, str]] = {
    "ProviderAuthError": AUTH,
    "ProviderCredentialMissing": AUTH,
    names.LLM_ENDPOINT_NOT_ALLOWED: AUTH,
    "Forbidden": AUTH,
    "Unauthenticated": AUTH,
    "SecretUnavailable": AUTH,
    "ProviderQuotaExceeded": QUOTA,
    "BudgetExceeded": QUOTA,
    "BudgetHeld": QUOTA,
    "ProviderRateLimited": RATE,
    "CredentialRateLimited": RATE,
    "QueueFull": RATE,
    "ProviderServerError": OUTAGE,
    "ProviderUnavailable": OUTAGE,
    "ProviderUnreachable": OUTAGE,
    "ProviderBadResponse": OUTAGE,
    names.PROVIDER_OUTAGE: OUTAGE,
    "DatabaseUnavailable": OUTAGE,
    names.TOOL_ERROR_DATABASE: OUTAGE,
    "ProviderTimeout": TIMEOUT,
    "ProviderBadRequest": INVALID_REQUEST,
    "ProviderNotFound": INVALID_REQUEST,
    "ProviderConflict": INVALID_REQUEST,
    "ProviderUnknown": INVALID_REQUEST,
    names.RECORD_REFUSED: INVALID_REQUEST,
    names.TOOL_ERROR_DATA: INVALID_REQUEST,
    "NotFound": INVALID_REQUEST,
    "Conflict": INVALID_REQUEST,
    "SpecInvalid": INVALID_REQUEST,
    "InputInvalid": INVALID_REQUEST,
    "ConfigError": INVALID_REQUEST,
}

RPC_CATEGORIES: Final[dict[RPCStatusCode, str]] = {
    RPCStatusCode.UNAUTHENTICATED: AUTH,
    RPCStatusCode.PERMISSION_DENIED: AUTH,
    RPCStatusCode.RESOURCE_EXHAUSTED: RATE,
    RPCStatusCode.UNAVAILABLE: OUTAGE,
    RPCStatusCode.ABORTED: OUTAGE,
    RPCStatusCode.DEADLINE_EXCEEDED: TIMEOUT,
    RPCStatusCode.INVALID_ARGUMENT: INVALID_REQUEST,
    RPCStatusCode.FAILED_PRECONDITION: INVALID_REQUEST,
    RPCStatusCode.NOT_FOUND: INVALID_REQUEST,
    RPCStatusCode.ALREADY_EXISTS: INVALID_REQUEST,
    RPCStatusCode.OUT_OF_RANGE: INVALID_REQUEST,
}

# A stored cause starts with its category; a park that ran out names it after its reason.
_CATEGORY_IN = re.compile(rf"(?:^|\): )({'|'.join(CATEGORIES)}): ")
_LONG_QUOTE = re.compile(rf"'[^'\n]{{{QUOTE_MAX + 1},}}'|\"[^\"\n]{{{QUOTE_MAX + 1},}}\"")
_SPACE = re.compile(r"\s+")


def status_category(status: int, code: str | None = None) -> str:
    """The category of an HTTP error answer: 401/403 auth, 402 (or a quota code) quota, 429
    rate, 408 and 504 timeout, other 5xx outage, any other 4xx invalid request."""
    if status == 402 or code == "insufficient_quota":
        return QUOTA
    if status in (401, 403):
        return AUTH
    if status == 429:
        return RATE
    if status in (408, 504):
        return TIMEOUT
    return OUTAGE if status >= 500 else INVALID_REQUEST


@dataclass(frozen=True)
class Failure:
    """One failure's cause: its type, category and cleaned message."""

    type: str
    category: str
    message: str

    def __str__(self) -> str:
        # A message that already names its type ("ProviderAuthError: HTTP 401 …") keeps it once.
        if not self.message or self.message == self.type:
            return f"{self.category}: {self.type}"
        if self.message.startswith(self.type + ":"):
            return f"{self.category}: {self.message}"
        return f"{self.category}: {self.type}: {self.message}"


def causes(exc: BaseException) -> Iterator[BaseException]:
    """The causes below `exc`, outermost first (Temporal's `.cause` is Python's `__cause__`)."""
    seen = exc.__cause__
    for _ in range(CHAIN_MAX):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__


def innermost(exc: BaseException) -> BaseException:
    """The deepest cause of `exc`, or `exc` itself."""
    return (exc, *causes(exc))[-1]


def type_of(exc: BaseException) -> str:
    """An ApplicationError's own type, else the exception class's name."""
    if isinstance(exc, ApplicationError) and exc.type:
        return exc.type
    return type(exc).__name__


def category_of(exc: BaseException) -> str:
    """The category of one exception (not its causes)."""
    if isinstance(exc, ApplicationError):
        found = TYPE_CATEGORIES.get(exc.type or "")
        if found is None and exc.details and isinstance(exc.details[0], dict):
            status = exc.details[0].get("status")
            if isinstance(status, int):
                found = status_category(status, exc.details[0].get("code"))
        return found or BUG
    if isinstance(exc, (TemporalTimeout, TimeoutError)):
        return TIMEOUT
    if isinstance(exc, RPCError):
        return RPC_CATEGORIES.get(exc.status, BUG)
    if isinstance(exc, (ConnectionError, OSError)):
        return OUTAGE
    own = getattr(exc, "category", None)  # an error of ours that knows its category (PollFailed)
    if own in CATEGORIES:
        return str(own)
    return TYPE_CATEGORIES.get(type(exc).__name__, BUG)


def clean(text: str, limit: int = MESSAGE_MAX) -> str:
    """`text` on one line, credentials redacted, long quotes cut, at most `limit` characters."""
    text = _SPACE.sub(" ", redact(text)).strip()
    text = _LONG_QUOTE.sub(lambda m: m.group(0)[0] + "…" + m.group(0)[0], text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def message_of(exc: BaseException) -> str:
    """The exception's own text (a Temporal failure's message, without its causes)."""
    if isinstance(exc, FailureError):
        return exc.message
    if isinstance(exc, RPCError):
        return exc.message
    return str(exc)


def describe(exc: BaseException) -> Failure:
    """The failure of `exc` by its innermost cause; a time-out on the way down is the cause,
    with its last attempt's failure (Temporal puts that below a retried activity's time-out)."""
    for seen in (exc, *causes(exc)):
        if isinstance(seen, TemporalTimeout):
            last = seen.__cause__
            said = message_of(seen) + (f" (last attempt: {describe(last)})" if last else "")
            return Failure("TimeoutError", TIMEOUT, clean(said))
    cause = innermost(exc)
    return Failure(type_of(cause), category_of(cause), clean(message_of(cause)))


def category_in(text: str | None) -> str:
    """The category a recorded cause names (`<category>: …` at its start, or after a park's
    reason), else `other`: a metric's label from a stored reason, never its message."""
    found = _CATEGORY_IN.search(text or "")
    return found.group(1) if found else "other"


def reason(exc: BaseException, limit: int = 500) -> str:
    """`describe(exc)` as one bounded line: `<category>: <Type>: <message>`."""
    return str(describe(exc))[:limit]
