"""The data tools need a store to reach: apply names the field to fix."""

from __future__ import annotations

import pytest

from eventos.errors import SpecInvalid
from eventos.spec.model import load_specs


def spec(agent: str, triggers: str = "[{kind: chat}]") -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: keeper}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}, {agent}}}]
  triggers: {triggers}
"""


@pytest.mark.parametrize(
    ("agent", "triggers", "error"),
    [
        ("tools: [data_put]", "[{kind: chat}]", "data_put needs the stores it may write"),
        (
            "tools: [data_put], data_stores: [stock]",
            "[{kind: watch, store: prices}]",
            None,
        ),
        (
            "tools: [data_put, data_get]",
            "[{kind: watch, store: prices}]",
            "data_put needs the stores it may write",
        ),
        ("tools: [data_list]", "[{kind: chat}]", "data_list needs a store"),
        ("tools: [data_get, data_list]", "[{kind: watch, store: prices}]", None),
        ("tools: [data_get], data_stores: [Bad]", "[{kind: chat}]", "should match pattern"),
        ("tools: [data_get]", "[{kind: watch, store: a.b}]", "should match pattern"),
    ],
)
def test_data_tools_need_a_store(agent: str, triggers: str, error: str | None) -> None:
    if error is None:
        (loaded,) = load_specs(spec(agent, triggers))
        assert loaded.name == "keeper"
        return
    with pytest.raises(SpecInvalid) as raised:
        load_specs(spec(agent, triggers))
    assert any(error in message for _, message in raised.value.errors), raised.value.errors
