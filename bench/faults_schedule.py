"""The fault schedule: which process dies when, drawn from a seed, and the thread that does it.

A plan kills every target `kills_each` times, in rounds (each round every target once, in a
shuffled order), and loses PostgreSQL and Temporal for a while, spread evenly over the rounds.
The moments are random: the gaps between faults are drawn around the mean that fits the plan
into the run. One fault at a time: the next one waits until the instance is whole again (every
service ready, both servers up), so each kill hits a working system at an unplanned step.
The same seed and profile give the same plan.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from faults_instance import POSTGRES, TEMPORAL

KILL = "kill"
LOSE = "lose"
LEAD_S = 20.0  # load before the first fault
TAIL_S = 20.0  # load after the last fault is back
KILL_COST_S = 5.0  # a restart and its readiness, on a loaded 2-core machine
LOSS_COST_S = 20.0  # the recovery after an outage
MIN_GAP_S = 2.0
RECOVERY_S = 300.0  # the instance is whole again by then, or the run fails


@dataclass(frozen=True)
class Profile:
    """How many faults of each kind, and how long the outages last."""

    minutes: float
    kills_each: int
    postgres_losses: int
    temporal_losses: int
    postgres_s: float = 30.0
    temporal_s: float = 120.0

    @classmethod
    def for_minutes(cls, minutes: float) -> Profile:
        """The bench's density: in an hour, every target killed 12 times and each server lost
        4 times (the targets are ≥ 10 and ≥ 3), whatever the gaps drawn."""
        return cls(minutes, kills_each=max(2, math.ceil(minutes / 5)),
                   postgres_losses=max(1, math.ceil(minutes / 15)),
                   temporal_losses=max(1, math.ceil(minutes / 15)))  # fmt: skip


@dataclass(frozen=True)
class Fault:
    """One planned fault: at `at_s` seconds into the load, kill `target` or lose it for
    `seconds`."""

    at_s: float
    kind: str
    target: str
    seconds: float = 0.0

    def __str__(self) -> str:
        lost = f" for {self.seconds:g} s" if self.kind == LOSE and self.seconds else ""
        return f"{self.at_s:7.1f} s  {self.kind} {self.target}{lost}"


def plan(seed: int, targets: list[str], profile: Profile) -> list[Fault]:
    """The faults of one run, in order."""
    rng = random.Random(seed)
    kinds: list[tuple[str, str, float]] = []
    for _ in range(profile.kills_each):
        order = list(targets)
        rng.shuffle(order)
        kinds += [(KILL, t, 0.0) for t in order]
    losses = [(LOSE, POSTGRES, profile.postgres_s)] * profile.postgres_losses
    losses += [(LOSE, TEMPORAL, profile.temporal_s)] * profile.temporal_losses
    rng.shuffle(losses)
    for i, loss in enumerate(losses):  # evenly among the kills, never first
        kinds.insert(round((i + 0.5) * (len(kinds) + i) / len(losses)) + 1, loss)
    busy = sum(KILL_COST_S if k == KILL else s + LOSS_COST_S for k, _, s in kinds)
    window = profile.minutes * 60 - LEAD_S - TAIL_S
    gap = max(MIN_GAP_S, (window - busy) / len(kinds))
    faults, at = [], LEAD_S
    for kind, target, seconds in kinds:
        at += rng.uniform(0.2, 1.8) * gap
        faults.append(Fault(round(at, 1), kind, target, seconds))
        at += KILL_COST_S if kind == KILL else seconds + LOSS_COST_S
    return faults


@dataclass
class Done:
    """A fault as it happened (wall clock, comparable with the database's timestamps)."""

    fault: Fault
    began: float  # the kill was sent
    down: float  # the process was gone
    up: float = 0.0  # a lost server was started again
    back: float = 0.0  # the instance was whole again (0: never)

    @property
    def label(self) -> str:
        return f"{self.fault.kind} {self.fault.target}"


Moment = Callable[[float | None], None]  # when something happened (None: now)


class FaultTarget(Protocol):
    """What a plan is carried out against: a local instance (faults_instance.Instance) or a
    release on a cluster (tests/k8s/k8s_faults.py). Each fault call returns once the target is
    gone (and, for a loss, started again), calling `down` and `up` with the moments."""

    def kill(self, target: str, down: Moment) -> None: ...

    def lose_postgres(self, seconds: float, down: Moment, up: Moment) -> None: ...

    def lose_temporal(self, seconds: float, down: Moment, up: Moment) -> None: ...

    def ready(self) -> bool:
        """Whole: every service ready, both servers up."""
        ...

    def not_ready(self) -> list[str]:
        """What is not ready (for a progress line)."""
        ...

    def revive(self) -> None:
        """Start a server that exited by itself (where nothing else would)."""
        ...


@dataclass
class Executor:
    """Carries out a plan against a target, in a thread, one fault at a time."""

    instance: FaultTarget
    faults: list[Fault]
    say: Callable[[str], None]
    done: list[Done] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, began: float) -> None:
        """Start at wall time `began` (the load's start, from which `at_s` counts)."""
        self._thread = threading.Thread(target=self._run, args=(began,), name="faults",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(RECOVERY_S)

    @property
    def finished(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def _run(self, began: float) -> None:
        try:
            for fault in self.faults:
                if self._stop.wait(max(0.0, began + fault.at_s - time.time())):
                    return
                self._whole(f"before {fault.kind} {fault.target}")
                self.done.append(self._apply(fault))
                self._whole(f"after {fault.kind} {fault.target}")
                self.done[-1].back = time.time()
                self.say(f"fault {len(self.done)}/{len(self.faults)}: {self.done[-1].label} "
                         f"back in {self.done[-1].back - self.done[-1].began:.1f} s")  # fmt: skip
        except BaseException as exc:  # reported by the run, which stops the load
            self.error = exc

    def _apply(self, fault: Fault) -> Done:
        done = Done(fault, time.time(), 0.0)

        def gone(at: float | None = None) -> None:
            done.down = at or time.time()

        def starting(at: float | None = None) -> None:
            done.up = at or time.time()

        if fault.kind == KILL:
            self.instance.kill(fault.target, gone)
        elif fault.target == POSTGRES:
            self.instance.lose_postgres(fault.seconds, gone, starting)
        else:
            self.instance.lose_temporal(fault.seconds, gone, starting)
        return done

    def _whole(self, when: str) -> None:
        """Wait until every service is ready and both servers run (a server that exited by
        itself is started again)."""
        deadline = time.monotonic() + RECOVERY_S
        while True:
            self.instance.revive()
            if self.instance.ready() or self._stop.is_set():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the target was not whole {RECOVERY_S:g} s {when}: "
                                   f"not ready: {self.instance.not_ready()}")  # fmt: skip
            time.sleep(0.5)  # a readiness poll, between probes
