"""The rule an approval names (issue 26): a tool call's `approvals.tools` entry, a send's channel
under `approvals.sends`, the content rules that matched (their ids, never what matched)."""

from __future__ import annotations

import pytest

from eventos.outbox.approvals import rule_of, view


@pytest.mark.parametrize(
    ("row", "rule"),
    [({"kind": "tool", "draft": 'set_alarm {"in_s": 60}'}, "approvals.tools: set_alarm"),
     ({"kind": "send", "channel": "telegram", "held_reason": "approval"},
      "approvals.sends: telegram"),
     ({"kind": "send", "channel": "email", "held_reason": "no-prices,pii"},
      "content_rules: no-prices, pii"),
     ({"kind": "send", "channel": "email", "held_reason": "no-prices,approval"},
      "approvals.sends: email; content_rules: no-prices")],
)  # fmt: skip
def test_an_approval_names_the_rule_that_held_it(row: dict[str, str], rule: str) -> None:
    assert rule_of(row) == rule


def test_only_the_admin_sees_the_rule() -> None:
    row = {"id": "ap-x-1", "kind": "send", "channel": "email", "held_reason": "secret-rule"}
    assert view(row)["rule"] == "content_rules: secret-rule"
    shown = view(row, admin=False)
    assert shown["rule"] is None and "held_reason" not in shown
