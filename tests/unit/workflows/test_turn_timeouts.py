"""The turns' attempt timeouts an operator sets (settings.TurnTimeouts), and the old fixed
values for the arguments of runs begun before they existed."""

from __future__ import annotations

import pytest

from eventos import names
from eventos.contracts import StreamCursor, TurnInput
from eventos.errors import ConfigError
from eventos.settings import TurnTimeouts


def test_the_defaults_are_the_products_and_the_environment_overrides_them() -> None:
    assert TurnTimeouts.from_env({}) == TurnTimeouts(30.0, 60.0)
    assert TurnTimeouts().send_s == names.SEND_CLAIM_TTL_S
    env = {"EVENTOS_TURN_SEND_TIMEOUT_S": "12", "EVENTOS_TURN_LLM_HEARTBEAT_S": "7.5"}
    assert TurnTimeouts.from_env(env) == TurnTimeouts(12.0, 7.5)
    with pytest.raises(ConfigError, match="EVENTOS_TURN_LLM_HEARTBEAT_S"):
        TurnTimeouts.from_env({"EVENTOS_TURN_LLM_HEARTBEAT_S": "0"})
    with pytest.raises(ConfigError, match="EVENTOS_TURN_SEND_TIMEOUT_S"):
        TurnTimeouts.from_env({"EVENTOS_TURN_SEND_TIMEOUT_S": "soon"})


def test_cursors_and_turns_of_older_runs_keep_the_old_timeouts() -> None:
    """An argument recorded before the fields existed decodes with the old fixed values."""
    cursor = StreamCursor("e/g1/talk/t", "e", 1, names.LANE_TALK, "t", 0)
    turn = TurnInput("t-1", "e", 1, "front", "t", "e/g1/talk/t", 1, {}, [])
    for timeouts in (cursor, turn):
        assert (timeouts.send_timeout_s, timeouts.llm_heartbeat_s) == (30.0, 60.0)
