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


@dataclass(frozen=True)
class Unclear:
    reason: str


@dataclass(frozen=True)
class Held:
    reason: str  # the row's `held_reason`, a short name (`window_closed`)


SendOutcome = Delivered | Deferred | Refused | Unclear | Held


class Sender(Protocol):
    """One channel's provider call."""

    driver: str
    idempotent: bool

    async def send(self, out: Outgoing) -> SendOutcome: ...
