"""The approval gate in words (eventos.timeline.gates): which approval, which rule asked for
it (never what matched), until its expiry; the input in the held turn or behind it; checked
after Temporal's breaker and before everything the entity checks after the turn."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from eventos import names
from eventos.timeline.gates import (
    APPROVAL,
    IN_TURN,
    TEMPORAL_UNAVAILABLE,
    Facts,
    StreamFacts,
    delivered_gate,
    rule_words,
)

NOW = datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
EXPIRES = NOW + timedelta(hours=48)


def held(kind: str = "send", status: str = "done", **more: Any) -> dict[str, Any]:
    return {"n": 3, "status": status, "chains": ["c-in"], "approval_id": "ap-x-7",
            "approval_kind": kind, "approval_state": names.APPROVAL_PENDING,
            "approval_expires_at": EXPIRES, "approval_reason": "no-refunds",
            "approval_channel": "chat", "approval_tool": "set_alarm", **more}  # fmt: skip


def facts(**more: Any) -> Facts:
    return Facts(now=NOW, generation=1, generation_state=names.GEN_RUNNING, pause_reason=None,
                 budget_state=names.BUDGET_NORMAL, daily_usd=None, used_usd=Decimal(0),
                 period_end=None, **more)  # fmt: skip


def stream(h: dict[str, Any]) -> StreamFacts:
    row = {"stream_key": "s", "lane": names.LANE_TALK, "thread": "main", "employee": "e"}
    return StreamFacts(row, 1, 10, [], {}, held=h)


def test_the_rule_is_named_never_what_it_matched() -> None:
    assert rule_words("send", "no-refunds,rivals", "telegram", None) == (
        "content rule no-refunds, content rule rivals")  # fmt: skip
    assert rule_words("send", "approval", "telegram", None) == "spec.approvals.sends (telegram)"
    assert rule_words("tool", None, None, "http_request") == "spec.approvals.tools (http_request)"


def test_inputs_behind_a_held_reply_wait_for_its_approval_until_it_expires() -> None:
    gate = delivered_gate(facts(), stream(held()), names.C1_OWNER, "c-next")
    assert (gate.code, gate.until, gate.approval) == (APPROVAL, EXPIRES, "ap-x-7")
    assert gate.text == ("waits for approval ap-x-7 of turn 3's reply (content rule no-refunds): "
                         f"approve or decline it; it expires at {EXPIRES.isoformat()}; the "
                         "conversation's next turn starts once it is decided")  # fmt: skip


def test_an_input_in_a_turn_whose_tool_call_waits_is_in_it() -> None:
    h = held("tool", "running")
    inside = delivered_gate(facts(), stream(h), names.C1_OWNER, "c-in")
    assert inside.text.startswith("waits for approval ap-x-7 of its turn's tool call "
                                  "(spec.approvals.tools (set_alarm))")  # fmt: skip
    assert inside.text.endswith("the turn goes on once it is decided")
    after = delivered_gate(facts(), stream(h), names.C1_OWNER, "c-later")
    assert "of turn 3's tool call" in after.text


def test_a_decided_approval_holds_no_more_and_the_breaker_comes_first() -> None:
    decided = delivered_gate(facts(), stream(held(approval_state="approved")), 1, "c-next")
    assert (decided.code, decided.until, decided.approval) == (IN_TURN, None, "ap-x-7")
    assert decided.text.startswith("turn 3 acts on approval ap-x-7 (approved) and goes on")
    down = facts(breaker_probe_at=NOW + timedelta(seconds=5), breaker_opened_at=NOW)
    assert delivered_gate(down, stream(held()), 1, "c-next").code == TEMPORAL_UNAVAILABLE
