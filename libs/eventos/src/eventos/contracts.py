"""Dataclasses that cross services and Temporal. Side-effect free: workflows import them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StreamCursor:
    """A ConversationWorkflow's argument: which stream it serves and what it already applied."""

    stream_key: str
    employee: str
    generation: int
    lane: str
    thread: str
    applied_seq: int


@dataclass(frozen=True)
class DeliveryItem:
    """One input as the entity sees it (payload ≤ 64 KB, or a body reference)."""

    seq: int
    ingress_id: int
    klass: int
    type: str
    route: dict[str, Any]
    chain_id: str
    hop: int
    size: int
    payload: dict[str, Any] | None = None
    body_ref: str | None = None
    causation_id: str | None = None


@dataclass(frozen=True)
class DeliverBatch:
    """What one `deliver` Signal carries: at most 16 items or 256 KB, in seq order."""

    stream_key: str
    items: list[DeliveryItem] = field(default_factory=list)


@dataclass(frozen=True)
class EntityStatus:
    """The `status` Query of a ConversationWorkflow."""

    stream_key: str
    applied_seq: int
    pending: int
    received: int
    dropped: int
    signals: int
