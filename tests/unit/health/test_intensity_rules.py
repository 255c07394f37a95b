"""Restart intensity's and `degraded`'s rules as functions (SPEC §12), and their settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from eventos import names
from eventos.contracts import AdmitRequest
from eventos.errors import ConfigError
from eventos.health.degraded import reason_for
from eventos.health.intensity import admission_refusal, backoff_of, verdict
from eventos.settings import SupervisionSettings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CFG = SupervisionSettings()


def facts(recent: int, in_hour: int, **kw: Any) -> dict[str, Any]:
    row = {"in_backoff_window": recent, "in_quarantine_window": in_hour, "now": NOW,
           "backoff_step": 0, "backoff_at": None, "quarantined_at": None}  # fmt: skip
    return {**row, **kw}


def test_backoffs_in_a_row_are_1_5_then_30_minutes() -> None:
    assert [backoff_of(CFG, step) for step in (1, 2, 3, 4, 9)] == [60, 300, 1800, 1800, 1800]


@pytest.mark.parametrize(
    ("row", "hold", "after"),
    [
        (facts(2, 2), None, None),  # below: retry once, then dead-letter as before
        (facts(3, 3), names.HOLD_BACKOFF, 60),
        (
            facts(4, 4, backoff_step=1, backoff_at=NOW - timedelta(minutes=2)),
            names.HOLD_BACKOFF,
            300,
        ),
        (
            facts(3, 4, backoff_step=2, backoff_at=NOW - timedelta(minutes=20)),
            names.HOLD_BACKOFF,
            1800,
        ),
        (
            facts(3, 4, backoff_step=2, backoff_at=NOW - timedelta(hours=2)),
            names.HOLD_BACKOFF,
            60,
        ),  # a backoff more than an hour ago starts the steps again
        (facts(1, 5), names.HOLD_QUARANTINED, None),  # 5 in an hour, however spread
        (facts(0, 0, quarantined_at=NOW), names.HOLD_QUARANTINED, None),
    ],
)
def test_a_threads_failed_turns_back_it_off_then_quarantine_it(
    row: dict[str, Any], hold: str | None, after: float | None
) -> None:
    found = verdict(row, CFG)
    assert found.hold == hold
    assert found.until == (NOW + timedelta(seconds=after) if after else None)


def test_admission_refuses_a_quarantined_or_backed_off_thread_and_a_degraded_background() -> None:
    def ask(klass: int) -> AdmitRequest:
        return AdmitRequest("e", 1, "front", "main", "e/g1/talk/main", klass)

    quarantined = admission_refusal(ask(1), {"quarantined": True, "backoff_left_s": 30.0})
    assert quarantined is not None and quarantined.gate == names.GATE_QUARANTINED
    backed = admission_refusal(ask(1), {"quarantined": False, "backoff_left_s": 42.5})
    assert backed is not None and (backed.gate, backed.retry_after_s) == (names.GATE_BACKOFF, 42.5)
    assert admission_refusal(ask(1), {"backoff_left_s": -3.0}) is None  # it ended
    for klass, refused in ((1, False), (2, False), (3, True), (4, True)):
        answer = admission_refusal(ask(klass), {"degraded": True})
        assert (answer is not None) is refused
        assert answer is None or answer.gate == names.GATE_DEGRADED


@pytest.mark.parametrize(
    ("failed", "ended", "quarantined", "degraded"),
    [(10, 33, 0, True), (10, 34, 0, False), (9, 9, 0, False), (0, 0, 3, True), (0, 5, 2, False)],
)
def test_an_employee_is_degraded_at_30_percent_with_10_failed_or_3_quarantined(
    failed: int, ended: int, quarantined: int, degraded: bool
) -> None:
    row = {"failed": failed, "ended": ended, "quarantined": quarantined}
    assert (reason_for(row, CFG) is not None) is degraded


def test_settings_read_their_variables_and_refuse_bad_values() -> None:
    env = {"EVENTOS_SUPERVISION_BACKOFF_S": "1, 2.5,3", "EVENTOS_SUPERVISION_QUARANTINE_AFTER": "7",
           "EVENTOS_SUPERVISION_DEGRADED_SHARE": "0.5"}  # fmt: skip
    cfg = SupervisionSettings.from_env(env)
    assert (cfg.backoff_s, cfg.quarantine_after, cfg.degraded_share) == ((1.0, 2.5, 3.0), 7, 0.5)
    assert SupervisionSettings.from_env({}) == SupervisionSettings()
    bad = [("BACKOFF_S", "60,0"), ("QUARANTINE_AFTER", "five"), ("DEGRADED_SHARE", "1.5"),
           ("PASS_S", "-1"), ("BACKOFF_AFTER", "2.5")]  # fmt: skip
    for name, value in bad:
        with pytest.raises(ConfigError, match=f"EVENTOS_SUPERVISION_{name}"):
            SupervisionSettings.from_env({f"EVENTOS_SUPERVISION_{name}": value})
