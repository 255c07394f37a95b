"""What a channel's sender is given and what it answers (SPEC §11).

A sender makes one provider call and says what became of it, in the only four ways that
matter to the `unknown` rule: delivered (with the provider's id); deferred (surely not sent,
try later: a rate limit or a connection never made); refused (surely not sent, and never will
be: a blocked bot, an unknown chat); unclear (the call may have reached the provider: a timeout
after the request went out, a cut connection, a provider error). Only a sender whose provider
deduplicates on our key (`idempotent`) may be called again after an unclear outcome.

A fifth outcome, held, is a send the provider's rules forbid for now (WhatsApp's 24-hour
window closed): surely not sent, kept `held` with its reason for the owner to see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from eventos import failures


@dataclass(frozen=True)
class Outgoing:
    """One send, as the provider call needs it."""

    outbound_id: int
    idempotency_key: str
    account: str  # the account's name (its credential reference)
    credential: bytes = field(repr=False)
    recipient: str = field(repr=False)
    body: str = field(repr=False)


@dataclass(frozen=True)
class Delivered:
    provider_message_id: str


@dataclass(frozen=True)
class Deferred:
    reason: str
    retry_after_s: float | None = None


@dataclass(frozen=True)
class Refused:
    reason: str
    category: str = failures.INVALID_REQUEST  # why, for the owner (eventos.failures)


@dataclass(frozen=True)
class Unclear:
    reason: str
    category: str = failures.OUTAGE


def http_category(status: int) -> str:
    """A provider's HTTP error status as a failure category (0: no answer: an outage)."""
    return failures.status_category(status) if status else failures.OUTAGE


def unanswered(exc: BaseException) -> str:
    """A call that got no answer: timed out, or its connection broke."""
    return failures.TIMEOUT if "Timeout" in type(exc).__name__ else failures.OUTAGE


@dataclass(frozen=True)
class Held:
    reason: str  # the row's `held_reason`, a short name (`window_closed`)


SendOutcome = Delivered | Deferred | Refused | Unclear | Held


class Sender(Protocol):
    """One channel's provider call."""

    driver: str
    idempotent: bool

    async def send(self, out: Outgoing) -> SendOutcome: ...
