"""The storm guards' bucket and breaker (SPEC §10) on a clock the test owns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from eventos import names
from eventos.messaging import storm
from eventos.messaging.storm import DELIVER, DIGEST, Edge, decide, loop_reason

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def fresh() -> Edge:
    return Edge(tokens=names.STORM_BURST, updated_at=T0)


def run(edge: Edge, times: list[datetime]) -> tuple[Edge, list[storm.Verdict]]:
    out = []
    for t in times:
        edge, verdict = decide(edge, t)
        out.append(verdict)
    return edge, out


def test_loops_hops_and_self_wakes_are_named() -> None:
    assert loop_reason("a", "b", 8, ["a"]) is None
    assert loop_reason("a", "b", 9, ["a"]) == "loop_suppressed: hop 9"
    assert loop_reason("b", "a", 2, ["a", "b"]) == "loop_suppressed: cycle a -> b -> a"
    assert loop_reason("a", "a", 1, []) == "loop_suppressed: self-wake a"


def test_burst_20_then_10_a_minute() -> None:
    edge, verdicts = run(fresh(), [T0 + timedelta(milliseconds=i) for i in range(25)])
    assert [v.action for v in verdicts] == [DELIVER] * 20 + [DIGEST] * 5
    assert edge.exhausted_windows == 1 and edge.breaker == names.BREAKER_CLOSED
    # A minute later ten more tokens, no more.
    edge, verdicts = run(edge, [T0 + timedelta(seconds=60, milliseconds=i) for i in range(12)])
    assert [v.action for v in verdicts] == [DELIVER] * 10 + [DIGEST] * 2


def storm_minutes(edge: Edge, start: datetime, minutes: int, per_minute: int) -> tuple[Edge, list[storm.Verdict]]:  # fmt: skip
    times = [start + timedelta(minutes=m, seconds=i * 60 / per_minute)
             for m in range(minutes) for i in range(per_minute)]  # fmt: skip
    return run(edge, times)


def test_three_exhausted_windows_in_a_row_open_the_breaker_once() -> None:
    edge, verdicts = storm_minutes(fresh(), T0, 4, 40)
    opened = [v for v in verdicts if v.opened]
    assert len(opened) == 1 and edge.breaker == names.BREAKER_OPEN
    # Once open, nothing passes one by one until the hour is over.
    edge, verdicts = storm_minutes(edge, T0 + timedelta(minutes=10), 30, 2)
    assert {v.action for v in verdicts} == {DIGEST}


def test_a_calm_minute_resets_the_count() -> None:
    edge, _ = storm_minutes(fresh(), T0, 2, 40)  # two exhausted windows
    assert edge.exhausted_windows == 2
    edge, _ = run(edge, [T0 + timedelta(minutes=5)])  # minutes 2-4 calm, the bucket refills
    edge, verdicts = storm_minutes(edge, T0 + timedelta(minutes=6), 1, 40)
    assert edge.exhausted_windows == 1 and not any(v.opened for v in verdicts)


def opened_at(at: datetime) -> Edge:
    return Edge(tokens=0.0, updated_at=at, exhausted_windows=3, breaker=names.BREAKER_OPEN,
                opened_at=at)  # fmt: skip


def test_half_open_after_an_hour_a_probe_then_calm_closes() -> None:
    edge = opened_at(T0)
    edge, (v,) = run(edge, [T0 + timedelta(minutes=59)])
    assert v.action == DIGEST and edge.breaker == names.BREAKER_OPEN
    edge, (probe,) = run(edge, [T0 + timedelta(minutes=61)])
    assert probe.action == DELIVER and edge.breaker == names.BREAKER_HALF_OPEN
    edge, (calm,) = run(edge, [T0 + timedelta(minutes=63)])  # a calm minute after the probe
    assert calm.action == DELIVER and edge.breaker == names.BREAKER_CLOSED
    assert edge.exhausted_windows == 0


def test_half_open_and_still_hot_reopens_for_another_hour() -> None:
    edge = opened_at(T0)
    at = T0 + timedelta(minutes=61)
    edge, verdicts = run(edge, [at, at + timedelta(seconds=5)])
    assert [v.action for v in verdicts] == [DELIVER, DIGEST] and verdicts[1].opened
    assert edge.breaker == names.BREAKER_OPEN and edge.opened_at == at + timedelta(seconds=5)
    edge, (v,) = run(edge, [at + timedelta(minutes=59)])
    assert v.action == DIGEST  # the new hour counts from the reopening
