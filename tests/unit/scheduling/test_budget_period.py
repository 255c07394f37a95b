"""The budget's period (the owner's midnight plus a stable offset), its states and prices."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from eventos import names
from eventos.contracts import ChatMessage, LlmStepInput, ModelRef
from eventos.errors import ConfigError
from eventos.llm.prices import PriceTable
from eventos.scheduling.ledger import offset_of, period_of, state_for


def test_the_period_runs_from_the_owners_midnight_plus_the_offset() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)  # 13:00 in Berlin (CET, UTC+1)
    start, end = period_of("Europe/Berlin", 300, now)
    assert start == datetime(2026, 11, 29, 23, 5, tzinfo=UTC)
    assert end == datetime(2026, 11, 30, 23, 5, tzinfo=UTC)


def test_just_before_the_offset_the_previous_day_still_runs() -> None:
    now = datetime(2026, 11, 29, 23, 3, tzinfo=UTC)  # 00:03 in Berlin, offset 5 min
    start, end = period_of("Europe/Berlin", 300, now)
    assert (start, end) == (datetime(2026, 11, 28, 23, 5, tzinfo=UTC),
                            datetime(2026, 11, 29, 23, 5, tzinfo=UTC))  # fmt: skip


def test_a_daylight_saving_day_is_23_or_25_hours() -> None:
    spring = period_of("Europe/Berlin", 0, datetime(2026, 3, 29, 12, tzinfo=UTC))
    autumn = period_of("Europe/Berlin", 0, datetime(2026, 10, 25, 12, tzinfo=UTC))
    assert spring[1] - spring[0] == timedelta(hours=23)
    assert autumn[1] - autumn[0] == timedelta(hours=25)


def test_offsets_are_stable_per_employee_and_within_ten_minutes() -> None:
    offsets = {offset_of(f"e{i}") for i in range(500)}
    assert offset_of("support") == offset_of("support")
    assert min(offsets) >= 0 and max(offsets) <= 600
    assert len(offsets) > 300  # spread, so periods do not all end at once


@pytest.mark.parametrize(
    ("used", "state"),
    [("0", "normal"), ("7.99", "normal"), ("8", "high"), ("9.99", "high"), ("10.01", "max")],
)
def test_states_by_share_of_the_limit(used: str, state: str) -> None:
    assert state_for(Decimal(used), Decimal(10)) == state
    assert state_for(Decimal(used), None) == names.BUDGET_NORMAL


def step(model: ModelRef, text: str, max_tokens: int = 1000) -> LlmStepInput:
    return LlmStepInput("e", "turn-e-1", 0, 2, model, [ChatMessage("user", text)],
                        max_tokens=max_tokens)  # fmt: skip


def test_estimate_is_an_upper_bound_and_cost_uses_the_table() -> None:
    table = PriceTable.from_doc({
        "openai/gpt-4.1-mini": {"input_per_mtok": 0.4, "output_per_mtok": 1.6},
        "openai/*": {"input_per_mtok": 10, "output_per_mtok": 30},
    })  # fmt: skip
    mini = ModelRef("openai", "gpt-4.1-mini")
    # 300 bytes: 100 prompt tokens (+4 overhead) at 0.4, plus 1000 at 1.6, per million.
    assert table.estimate(step(mini, "x" * 300)) == Decimal("0.0016416")
    assert table.cost(mini, 1000, 100) == Decimal("0.00056")
    assert table.cost(ModelRef("openai", "gpt-5"), 1000, 0) == Decimal("0.01")
    assert table.cost(ModelRef("local", "scripted"), 10**6, 10**6) == 0  # unpriced


def test_prices_from_the_environment_fail_clearly() -> None:
    env = {"EVENTOS_LLM_PRICES": '{"local/*": {"input_per_mtok": 1, "output_per_mtok": 2}}'}
    assert PriceTable.from_env(env).cost(ModelRef("local", "x"), 10**6, 0) == 1
    with pytest.raises(ConfigError, match="EVENTOS_LLM_PRICES is not JSON"):
        PriceTable.from_env({"EVENTOS_LLM_PRICES": "{"})
    with pytest.raises(ConfigError, match="prices are non-negative numbers"):
        PriceTable.from_doc({"*": {"input_per_mtok": -1, "output_per_mtok": 0}})
    with pytest.raises(ConfigError, match="must be"):
        PriceTable.from_doc({"*": {"input": 1}})
