"""Admission policy (SPEC §9): floors under contention, unused shares flowing down, round-robin
between employees, the per-employee cap and the class ceilings."""

from __future__ import annotations

from collections import Counter, deque
from datetime import UTC, datetime, timedelta
from itertools import count

import pytest

from eventos import names
from eventos.errors import ConfigError
from eventos.scheduling.policy import Load, SchedConfig, Waiter, offers, pick_class

T0 = datetime(2026, 11, 30, tzinfo=UTC)
_ticks = count()


def waiter(employee: str, klass: int, served_at: datetime | None = None) -> Waiter:
    n = next(_ticks)
    return Waiter(f"{employee}/c{klass}/{n}", employee, klass, T0 + timedelta(seconds=n), served_at)


def empty_load() -> Load:
    return Load({}, {}, {})


def simulate(cfg: SchedConfig, demand: dict[int, int], admissions: int) -> Counter[int]:
    """Every class in `demand` always has waiters (one per employee slot); slots are held
    for equal times (the oldest turn ends first). Returns admissions per class."""
    load, running, admitted = empty_load(), deque[Waiter](), Counter[int]()
    waiters = [waiter(f"e{k}-{i}", k) for k, n in demand.items() for i in range(n)]
    while sum(admitted.values()) < admissions:
        for w in offers(cfg, load, waiters):
            waiters.remove(w)
            running.append(w)
            admitted[w.klass] += 1
            waiters.append(waiter(w.employee, w.klass))  # the backlog never runs dry
        done = running.popleft()
        load.by_class[done.klass] -= 1
        load.by_employee[done.employee] -= 1
    return admitted


@pytest.mark.parametrize("capacity", [8, 24, 50])
def test_floors_hold_under_contention(capacity: int) -> None:
    cfg = SchedConfig(capacity=capacity, class_max={k: capacity for k in names.CLASSES})
    admitted = simulate(cfg, {k: 30 for k in names.CLASSES}, 2000)
    total = sum(admitted.values())
    for klass, floor in names.CLASS_FLOORS.items():
        assert admitted[klass] / total == pytest.approx(floor, abs=0.02), admitted


def test_an_idle_class_share_flows_down_to_the_highest_class_waiting() -> None:
    """C1 and C2 are idle: C4 keeps its floor, C3 takes the rest (work is never refused)."""
    cfg = SchedConfig(capacity=8, class_max={k: 8 for k in names.CLASSES})
    admitted = simulate(cfg, {names.C3_INTERNAL: 30, names.C4_BACKGROUND: 30}, 1000)
    total = admitted[names.C3_INTERNAL] + admitted[names.C4_BACKGROUND]
    assert total >= 1000
    floor = names.CLASS_FLOORS[names.C4_BACKGROUND]
    assert admitted[names.C4_BACKGROUND] / total == pytest.approx(floor, abs=0.02)


def test_capacity_is_never_exceeded_and_every_free_slot_is_used() -> None:
    cfg = SchedConfig(capacity=8, class_max={k: 8 for k in names.CLASSES})
    load = empty_load()
    chosen = offers(cfg, load, [waiter(f"e{i}", names.C4_BACKGROUND) for i in range(20)])
    assert len(chosen) == 8 and load.held() == 8
    assert offers(cfg, load, [waiter("late", names.C1_OWNER)]) == []


def test_with_every_class_at_its_floor_the_highest_class_goes_first() -> None:
    at_floor = {k: round(f * 100) for k, f in names.CLASS_FLOORS.items()}
    assert pick_class(list(names.CLASSES), at_floor) == names.C1_OWNER
    starved = {**at_floor, names.C4_BACKGROUND: 0}
    assert pick_class(list(names.CLASSES), starved) == names.C4_BACKGROUND


def test_employees_take_turns_within_a_class() -> None:
    """An employee with a long queue does not starve one that asked later."""
    cfg = SchedConfig(capacity=4, class_max={k: 4 for k in names.CLASSES}, employee_cap=4)
    busy = [waiter("busy", names.C2_CUSTOMER) for _ in range(6)]
    late = [waiter("late", names.C2_CUSTOMER), waiter("later", names.C2_CUSTOMER)]
    chosen = offers(cfg, empty_load(), busy + late)
    assert [w.employee for w in chosen] == ["busy", "late", "later", "busy"]


def test_round_robin_remembers_who_was_served_last() -> None:
    cfg = SchedConfig(capacity=1, class_max={k: 1 for k in names.CLASSES})
    served = T0 + timedelta(hours=1)
    first = waiter("a", names.C3_INTERNAL, served_at=served)  # older, but served recently
    second = waiter("b", names.C3_INTERNAL, served_at=T0)
    assert [w.employee for w in offers(cfg, empty_load(), [first, second])] == ["b"]


def test_the_employee_cap_and_the_class_ceiling_hold() -> None:
    cfg = SchedConfig(capacity=20, class_max={1: 20, 2: 20, 3: 20, 4: 2}, employee_cap=4)
    load = Load({names.C2_CUSTOMER: 4}, {"full": 4}, {})
    ws = [waiter("full", names.C2_CUSTOMER)] + [waiter(f"bg{i}", 4) for i in range(5)]
    chosen = offers(cfg, load, ws)
    assert [w.employee for w in chosen] == ["bg0", "bg1"]  # C4 stops at its ceiling of 2


def test_offered_waiters_are_not_offered_twice() -> None:
    cfg = SchedConfig(capacity=4)
    w = waiter("a", names.C2_CUSTOMER)
    held = Waiter(w.stream_key, w.employee, w.klass, w.requested_at, offered=True)
    assert offers(cfg, empty_load(), [held]) == []


def test_settings_come_from_the_environment() -> None:
    env = {"EVENTOS_SCHED_CAPACITY": "8", "EVENTOS_SCHED_CLASS_MAX_C4": "2"}
    cfg = SchedConfig.from_env(env)
    assert cfg.capacity == 8 and cfg.class_max[names.C4_BACKGROUND] == 2
    assert cfg.class_max[names.C1_OWNER] == 8
    with pytest.raises(ConfigError, match="EVENTOS_SCHED_CAPACITY must be a positive integer"):
        SchedConfig.from_env({"EVENTOS_SCHED_CAPACITY": "0"})
