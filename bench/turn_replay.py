"""The workflow worker's CPU per workflow instance, replaying this release's recorded histories.

    .venv/bin/python bench/turn_replay.py [--repeat 20] [--rounds 3] [--quick]

Replays every history of `tests/histories/<this release>/` (an owner's turn, a customer's,
an entity's run, the supervisor, …) `--repeat` times in Temporal's Replayer, with the
sandbox and the data converter the workers use, each replay a new workflow instance as after
an eviction from the sticky cache. Each round replays the whole set twice: with the SDK's
payload walks as they come (the baseline) and with `eventos.runtime.payload_visits` skipping
the walks that cannot change a payload (as the workers run), in alternating order. Prints,
per workflow type and in all, the CPU of this process per instance (the best round of each,
so that a busy moment of a shared machine counts least) and the ratio of the two. A replay
that fails (nondeterminism) stops the bench. No server: the Replayer runs the histories in
this process.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from harness import BenchError, calibration_line, fmt, interrupt_guard, parse_with_quick, table
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from eventos.runtime import payload_visits
from eventos.runtime.payload_guard import GUARDED_DATA_CONVERTER
from eventos.workers.roles import WORKFLOWS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration" / "runtime"))
from release_histories import Recorded, recorded, this_release_folder

BASELINE, SKIPPED = "SDK walks", "walks skipped"


async def replay(histories: list[Recorded], repeat: int) -> dict[str, float]:
    """CPU seconds of this process by workflow type, each history replayed `repeat` times."""
    used: dict[str, float] = collections.defaultdict(float)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=GUARDED_DATA_CONVERTER)
    kinds = {f"{r.label}-{n}": r.workflow_type for r in histories for n in range(repeat)}

    async def each() -> AsyncIterator[WorkflowHistory]:
        for n in range(repeat):
            for r in histories:
                yield WorkflowHistory(f"{r.label}-{n}", r.history.events)

    async with replayer.workflow_replay_iterator(each()) as results:
        clock = time.process_time()
        async for result in results:
            if result.replay_failure is not None:
                raise BenchError(f"replay failed: {result.replay_failure}")
            now = time.process_time()
            used[kinds[result.history.workflow_id]] += now - clock
            clock = now
    return used


async def measure(histories: list[Recorded], count: collections.Counter[str], repeat: int,
                  rounds: int) -> dict[str, dict[str, float]]:  # fmt: skip
    """The best round of each mode: CPU ms per instance by workflow type (`count` of each)."""
    best: dict[str, dict[str, float]] = {BASELINE: {}, SKIPPED: {}}
    await replay(histories, 1)  # the first instances import what the workflows pass through
    for n in range(rounds):
        order = (BASELINE, SKIPPED) if n % 2 == 0 else (SKIPPED, BASELINE)
        for mode in order:
            if mode == SKIPPED:
                payload_visits.install()
            else:
                payload_visits.uninstall()
            used = await replay(histories, repeat)
            per = {k: 1000 * s / (count[k] * repeat) for k, s in used.items()}
            per["all"] = 1000 * sum(used.values()) / (len(histories) * repeat)
            for k, ms in per.items():
                best[mode][k] = min(best[mode].get(k, ms), ms)
    payload_visits.uninstall()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="replays of each history a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both modes")
    args = parse_with_quick(parser, {"repeat": 2, "rounds": 1})
    with interrupt_guard():
        print(calibration_line())
        folder = this_release_folder()
        histories = recorded(folder)
        if not histories:
            raise BenchError(f"no recorded histories in {folder}")
        count = collections.Counter(r.workflow_type for r in histories)
        best = asyncio.run(measure(histories, count, args.repeat, args.rounds))
        types = sorted(count)
        rows = [[k, count.get(k, len(histories)), fmt(best[BASELINE][k], 2),
                 fmt(best[SKIPPED][k], 2), fmt(best[SKIPPED][k] / best[BASELINE][k], 2)]
                for k in [*types, "all"]]  # fmt: skip
        print(f"\nreplay CPU per workflow instance, ms (best of {args.rounds} rounds, "
              f"{args.repeat} replays of each history a round)")  # fmt: skip
        print(table(["workflow type", "histories", BASELINE, SKIPPED, "ratio"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
