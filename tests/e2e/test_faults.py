"""The fault run in the suite (issue 17, EG1, EG13, I9): bench/faults.py's code, shortened.

A local instance of its own (embedded PostgreSQL, its own dev server, the six services as
processes under the instance's supervision) takes a steady mixed load — webhooks over three
employees, owner chat from two users and the admin with tool calls, driver events over gRPC,
Telegram customers — while every process and the Temporal server are SIGKILLed twice at
random moments, PostgreSQL is lost for 10 s and Temporal for 30 s. The ledger then adds up
everything acknowledged, consumed, replied and done (docs/faults.md says what each line checks).

The seed is fixed; another one replays another schedule and load:
    EVENTOS_FAULT_SEED=<n> .venv/bin/pytest -q -n 0 tests/e2e/test_faults.py
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

import pytest
from conftest import E2E_TIMEOUT_S

from eventos import names

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import faults
from faults_book import CHANNELS
from faults_instance import TEMPORAL
from faults_schedule import KILL

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

SEED = int(os.environ.get("EVENTOS_FAULT_SEED", "17"))


def test_kill_any_process_lose_the_servers_and_nothing_is_lost_or_done_twice(
    tmp_path: Path,
) -> None:
    config = faults.Config.for_test(SEED)
    result = faults.run(config, tmp_path)
    replay = f"replay: EVENTOS_FAULT_SEED={SEED} .venv/bin/pytest -q -n 0 {__file__}"
    (tmp_path / "ledger.txt").write_text(result.ledger.render())  # kept with the logs
    kills = collections.Counter(d.fault.target for d in result.done if d.fault.kind == KILL)
    assert set(kills) == {*names.SERVICES, TEMPORAL}, (kills, replay)
    assert min(kills.values()) >= 2, (kills, replay)
    assert len(result.done) == len(result.faults), (result.done, replay)
    assert set(result.acked) == set(CHANNELS), (result.acked, replay)  # every sender got through
    assert result.ledger.ok, f"{replay}\n{result.ledger.render()}"
