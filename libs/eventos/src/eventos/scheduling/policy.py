"""Admission policy (SPEC §9): who gets the next free turn slot. Pure; `admission` reads the
state from the database, asks here, and writes the answer.

Capacity is the number of turns the instance runs at once (each class also has a ceiling: its
LLM workers' slots). A free slot goes to a waiting class below its floor, the floor being its
share of the turns admitted in the recent window (the one furthest below first); when no
waiting class is below its floor, to the highest waiting class: a class's unused share flows
down. Within a class, employees take turns (the one served longest ago first), and no
employee holds more than its cap. The reserved owner slot is granted before any of this and
counts toward nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final

from eventos import names
from eventos.settings import positive_int

# Turns running at once per instance, and per class (keep each class's LLM worker slots at
# least this high, so a granted turn's step never waits for a worker slot).
DEFAULT_CAPACITY: Final = 24
DEFAULT_CLASS_MAX: Final = {
    names.C1_OWNER: 8,
    names.C2_CUSTOMER: 16,
    names.C3_INTERNAL: 8,
    names.C4_BACKGROUND: 4,
}
SHARE_WINDOW_S: Final = 300.0  # floors are shares of the turns admitted in this window


@dataclass(frozen=True)
class SchedConfig:
    """Admission's settings (`EVENTOS_SCHED_*`)."""

    capacity: int = DEFAULT_CAPACITY
    class_max: Mapping[int, int] = field(default_factory=lambda: dict(DEFAULT_CLASS_MAX))
    employee_cap: int = names.EMPLOYEE_TURN_CAP
    share_window_s: float = SHARE_WINDOW_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SchedConfig:
        """`EVENTOS_SCHED_CAPACITY` and `EVENTOS_SCHED_CLASS_MAX_C1`…`_C4` (positive integers)."""
        env = os.environ if env is None else env
        capacity = positive_int(env, "EVENTOS_SCHED_CAPACITY", DEFAULT_CAPACITY)
        class_max = {
            k: positive_int(env, f"EVENTOS_SCHED_CLASS_MAX_C{k}", DEFAULT_CLASS_MAX[k])
            for k in names.CLASSES
        }
        return cls(capacity=capacity, class_max=class_max)


@dataclass(frozen=True)
class Waiter:
    """An entity waiting for a slot."""

    stream_key: str
    employee: str
    klass: int
    requested_at: datetime
    served_at: datetime | None = None  # when its employee last got a slot of this class
    offered: bool = False  # a slot is kept for it until it asks again
    takes_held: bool = False  # the relay holds its inputs until its grant (eventos.delivery.held)


@dataclass
class Load:
    """What holds slots now (active leases and slots kept for offered waiters, reserved owner
    slots excluded) and what each class was admitted in the share window."""

    by_class: dict[int, int]
    by_employee: dict[str, int]
    admitted: dict[int, int]

    def held(self) -> int:
        return sum(self.by_class.values())


def pick_class(classes: Sequence[int], admitted: Mapping[int, int]) -> int:
    """The class the next slot goes to: the waiting class furthest below its floor (a share of
    admitted turns), else the highest waiting class."""
    total = sum(admitted.values())
    deficit = {k: names.CLASS_FLOORS[k] * total - admitted.get(k, 0) for k in classes}
    below = [k for k in classes if deficit[k] > 0]
    if below:
        return max(below, key=lambda k: (deficit[k], -k))
    return min(classes)


def offers(cfg: SchedConfig, load: Load, waiters: Sequence[Waiter]) -> list[Waiter]:
    """The waiters that get the free slots now, in the order they are served; `load` is
    updated with them."""
    chosen: list[Waiter] = []
    left = [w for w in waiters if not w.offered]
    while cfg.capacity - load.held() > 0:
        eligible = [
            w
            for w in left
            if load.by_class.get(w.klass, 0) < cfg.class_max[w.klass]
            and load.by_employee.get(w.employee, 0) < cfg.employee_cap
        ]
        if not eligible:
            break
        klass = pick_class(sorted({w.klass for w in eligible}), load.admitted)
        pick = min((w for w in eligible if w.klass == klass), key=_round_robin)
        chosen.append(pick)
        left.remove(pick)
        # The employee just served goes to the back of its class for the rest of this pass.
        left = [
            replace(w, served_at=datetime.max.replace(tzinfo=pick.requested_at.tzinfo))
            if (w.employee, w.klass) == (pick.employee, pick.klass)
            else w
            for w in left
        ]
        load.by_class[klass] = load.by_class.get(klass, 0) + 1
        load.by_employee[pick.employee] = load.by_employee.get(pick.employee, 0) + 1
        load.admitted[klass] = load.admitted.get(klass, 0) + 1
    return chosen


def _round_robin(w: Waiter) -> tuple[datetime, datetime, str]:
    never = datetime.min.replace(tzinfo=w.requested_at.tzinfo)
    return (w.served_at or never, w.requested_at, w.stream_key)
