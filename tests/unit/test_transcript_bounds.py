"""The transcript a turn loads stays within I7's bound and never starts with a tool result."""

from __future__ import annotations

import json

from eventos.turns import newest_within


def msg(role: str, n: int, size: int = 100) -> dict[str, object]:
    return {"role": role, "content": f"{n}:" + "x" * size}


def test_keeps_the_newest_messages_within_the_limit() -> None:
    messages = [msg("user", n) for n in range(100)]
    kept = newest_within(messages, 2000)
    assert kept == messages[-len(kept) :]
    assert sum(len(json.dumps(m)) for m in kept) <= 2000
    assert len(kept) < 100 and len(newest_within(messages, 10**9)) == 100


def test_never_starts_with_an_orphaned_tool_result() -> None:
    messages = [
        msg("user", 0),
        msg("assistant", 1),
        msg("tool", 2),
        msg("tool", 3),
        msg("assistant", 4),
    ]
    per = len(json.dumps(messages[-1]))
    kept = newest_within(messages, per * 3)  # would start at the second tool result
    assert [m["role"] for m in kept] == ["assistant"]
