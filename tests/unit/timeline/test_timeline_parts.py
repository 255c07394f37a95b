"""The timeline's pure parts: entries in words, cursors, and the entity's debounce deadline."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from eventos import names
from eventos.contracts import DeliveryItem
from eventos.errors import InputInvalid
from eventos.timeline.entries import NEWEST, OLDEST, Position, decode_cursor
from eventos.timeline.gates import debounce_until
from eventos.timeline.words import summary

T0 = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kind", "detail", "words"),
    [
        ("input.accepted", {"source": "webhook", "trigger": "webhook-stripe"},
         "webhook stripe accepted"),
        ("input.accepted", {"source": "chat", "trigger": "chat"}, "chat message accepted"),
        ("input.accepted", {"source": "whatsapp_business"}, "WhatsApp message accepted"),
        ("input.accepted", {"source": "ipc", "type": names.TYPE_IPC_TASK, "from": "ops"},
         "task from ops accepted"),
        ("input.accepted", {"source": "start", "trigger": "start"}, "start trigger fired"),
        ("input.accepted", {"source": "cron", "trigger": "nightly"}, "cron nightly fired"),
        ("input.routed", {"seq": 5, "class": 3}, "routed to its conversation as C3 input #5"),
        ("input.dead", {"seq": 5, "reason": "turn_failed"}, "input #5 dead (turn_failed)"),
        ("turn.started", {"n": 3, "class": 2, "inputs": 5, "waited_s": 1.2},
         "turn 3 started (C2, 5 inputs, waited 1.2 s for a slot)"),
        ("turn.done", {"n": 3, "steps": 2, "tokens": 1234, "usd": 0.0012},
         "turn 3 done: 2 steps, 1,234 tokens, $0.0012"),
        ("turn.done", {"n": 1, "steps": 1, "tokens": 1, "usd": 0}, "turn 1 done: 1 step, 1 token, $0.0000"),
        ("turn.failed", {"n": 4, "steps": 0, "tokens": 0, "usd": 0, "error": "ProviderBadRequest"},
         "turn 4 failed (ProviderBadRequest) after 0 steps, 0 tokens, $0.0000"),
        ("reply.sent", {"channel": "telegram"}, "reply sent"),
        ("reply.queued", {"channel": "chat", "retry": True},
         "reply queued again (the owner's Retry) (chat)"),
        ("alarm.fired", {"alarm_kind": "alarm"}, "alarm fired"),
        ("task.delegated", {"to": "ops"}, "task delegated to ops"),
        ("tool.unknown", {"tool": "http_request"},
         "tool http_request unknown: it may or may not have happened"),
        ("attention.raised", {"attention": "dead_input", "severity": "error"},
         "attention: dead_input (error)"),
    ],
)  # fmt: skip
def test_each_kind_in_words(kind: str, detail: dict[str, object], words: str) -> None:
    assert summary(kind, detail) == words


def test_a_cursor_round_trips_and_a_forged_one_is_refused() -> None:
    where = Position(OLDEST, T0, 42, {"kind": "turn"})
    assert decode_cursor(where.encode()) == where
    for forged in (
        [NEWEST, T0.isoformat(), "42", {}],  # an id that is not a number
        [NEWEST, "2026-12-04T08:00:00", 42, {}],  # a time without its offset
        ["sideways", T0.isoformat(), 42, {}],
        [NEWEST, T0.isoformat(), -1, {}],
        [NEWEST, T0.isoformat(), 42, {"kind": 5}],
        {"order": NEWEST},
    ):
        text = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode()
        with pytest.raises(InputInvalid):
            decode_cursor(text)


def item(seq: int, route: dict[str, object]) -> DeliveryItem:
    return DeliveryItem(seq, seq, names.C2_CUSTOMER, "msg", route, f"c{seq}", 0, 10)


def test_the_debounce_deadline_is_the_entitys() -> None:
    route = {"agent": "front", "kind": "telegram", "trigger": "tg"}
    born = {1: T0, 2: T0 + timedelta(seconds=1), 3: T0 + timedelta(seconds=7)}
    items = [item(s, route) for s in born]
    # Customers: 2 s after the last, at most 8 s after the first.
    assert debounce_until("customer", items, born, False) == T0 + timedelta(seconds=8)
    assert debounce_until("customer", items[:2], born, False) == T0 + timedelta(seconds=3)
    group = [item(1, {**route, "group": True})]
    assert debounce_until("customer", group, born, False) == T0 + timedelta(seconds=3)
    custom = [item(1, {**route, "debounce": {"window_s": 60, "cap_s": 120}})]
    assert debounce_until("worker", custom, born, False) == T0 + timedelta(seconds=60)
    assert debounce_until("worker", items, born, False) is None  # no debounce there
    assert debounce_until("customer", items, born, True) is None  # leftovers of a turn
