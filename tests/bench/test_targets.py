"""The gated drivers' exit codes follow their targets; EG14's backlog is judged by its slope.

A smoke run (`--quick`) says only that a driver runs, so it exits 0 whatever its figures say
(test_smoke.py); these tests hold the rule a full run exits by.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from fleet import Backlog
from harness import MISSED_EXIT, Targets

FULL_RUN = argparse.Namespace(quick=False, no_fail=False)


def test_every_target_passed_exits_0() -> None:
    targets = Targets()
    assert targets.check("drain rate", True) == "PASS"
    assert targets.check("turn p99", True) == "PASS"
    assert targets.exit_code(FULL_RUN) == 0


def test_a_missed_target_exits_non_zero_unless_told_not_to() -> None:
    targets = Targets()
    targets.check("drain rate", True)
    assert targets.check("turn p99", False) == "MISS"
    assert targets.exit_code(FULL_RUN) == MISSED_EXIT != 0
    assert targets.exit_code(argparse.Namespace(quick=False, no_fail=True)) == 0
    assert targets.exit_code(argparse.Namespace(quick=True, no_fail=False)) == 0


def test_a_run_that_checked_nothing_is_no_pass() -> None:
    assert Targets().exit_code(FULL_RUN) == 1


def backlog(samples: list[int], every: float = 5.0) -> Backlog:
    b = Backlog("postgresql://unused", every=every)  # never started: no thread, no connection
    b.samples = samples
    return b


def test_a_backlog_that_keeps_pace_is_bounded() -> None:
    # 10 webhooks/s: a queue in motion, up and down by a turn's worth, not rising.
    steady = backlog([0, 12, 30, 25, 31, 27, 33, 26, 30, 28, 32, 27])
    assert steady.growing(10.0) is False
    # Large but draining over the last third: not growing either.
    draining = backlog([0, 50, 100, 150, 200, 250, 300, 280, 250, 200, 150, 120])
    assert draining.growing(10.0) is False


def test_a_backlog_that_rises_through_the_last_third_is_growing() -> None:
    # 5 events/s against 4.4 turns/s (docs/scaling.md's tier L run past its rate): +3 a sample.
    rising = backlog([0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33], every=5.0)
    assert rising.growing(5.0) is True


def test_a_small_backlog_never_counts_as_growing() -> None:
    # Rising, but under two seconds of arrivals at its end: a few inputs in flight.
    small = backlog([0, 0, 1, 0, 1, 1, 2, 3, 4, 5, 6, 8], every=1.0)
    assert small.growing(5.0) is False


def test_too_few_samples_cannot_tell() -> None:
    assert backlog([0, 5, 9]).growing(10.0) is None
