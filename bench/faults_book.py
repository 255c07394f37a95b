"""What the senders and receivers of the fault run saw: every attempt to hand an event over and
its answer, every event acknowledged, and every reply and effect where it arrived.

Each event carries a tag (`fx-<channel>-<n>`) in its body, its text or its path, so the ledger
finds it in the inbox, in the transcripts and at the receivers without trusting any status.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

TAG = re.compile(r"\bfx-[a-z]+-\d+\b")
WEBHOOK, CHAT, DRIVER, TELEGRAM = "webhook", "chat", "driver", "telegram"
CHANNELS = (WEBHOOK, CHAT, DRIVER, TELEGRAM)


@dataclass(frozen=True)
class Attempt:
    """One hand-over as the sender saw it: when it began and ended, and the answer."""

    channel: str
    tag: str
    began: float  # wall clock
    ended: float
    answer: str  # "200 accepted", "202", "503", "ConnectError", "ACCEPTED", "confirmed"
    ok: bool  # a 2xx, an Ack ACCEPTED or DUPLICATE, a confirmed update


@dataclass(frozen=True)
class Acked:
    """An event the sender saw acknowledged: where the inbox must hold it, once."""

    channel: str
    tag: str
    source_key: str
    dedupe_key: str
    began: float  # the attempt that got the acknowledgement began
    at: float  # the acknowledgement arrived


@dataclass
class Book:
    """Shared by the senders (several threads: the driver client records acks in one)."""

    attempts: list[Attempt] = field(default_factory=list)
    acked: dict[str, Acked] = field(default_factory=dict)
    chat_ids: dict[str, tuple[str, int]] = field(default_factory=dict)  # tag → (audience, id)
    tools: set[str] = field(default_factory=set)  # chat tags that ask for an http_request
    # The owner's event streams as each audience read them: chat event id (its row's, not its
    # place) → the event.
    streams: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    stream_repeats: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attempt(self, a: Attempt) -> None:
        with self._lock:
            self.attempts.append(a)

    def ack(self, a: Acked) -> None:
        with self._lock:
            self.acked.setdefault(a.tag, a)  # a resent event's duplicate answer adds nothing

    def streamed(self, audience: str, event: dict[str, Any]) -> None:
        """One event of an audience's stream; an id seen again is counted as a repeat."""
        with self._lock:
            seen = self.streams.setdefault(audience, {})
            if int(event["id"]) in seen:
                self.stream_repeats[audience] += 1
            seen[int(event["id"])] = event

    def read_through(self) -> dict[str, int]:
        """Per audience, the last place its stream showed."""
        with self._lock:
            return {a: max((e["pos"] for e in events.values()), default=0)
                    for a, events in self.streams.items()}  # fmt: skip

    def counts(self) -> Counter[str]:
        """Acknowledged events per channel."""
        with self._lock:
            return Counter(a.channel for a in self.acked.values())

    def snapshot(self) -> tuple[list[Attempt], dict[str, Acked]]:
        with self._lock:
            return list(self.attempts), dict(self.acked)
