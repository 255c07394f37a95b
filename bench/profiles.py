"""py-spy profiles of a bench's service processes (`--py-spy DIR`): `py-spy record` on each,
raw collapsed stacks in `DIR/<process>.txt` (flamegraph.pl or speedscope read them), and each
one's ten hottest frames printed after the run.

py-spy samples from outside the process (non-blocking), and six of them cost a 2-core machine
enough to move every figure: at 100 Hz the tier L fleet's owner p99 went from 134 to 862 ms and
its CPU per event from 110 to 209 ms (2026-12-06). They sample at 25 Hz (a minute of load still
gives each busy process thousands of samples), and a bench states its figures from a run without
`--py-spy`, recording the profile in a run of its own.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from harness import table

from eventos import names

STOP_S = 60.0  # py-spy writes its file after SIGINT; a large profile takes a while
RATE_HZ = 25


def add_argument(parser: argparse.ArgumentParser, what: str = "the six services") -> None:
    parser.add_argument("--py-spy", type=Path, metavar="DIR",
                        help=f"record {what} with py-spy (raw stacks in DIR)")  # fmt: skip


def service_pids(pids: dict[str, int | None]) -> dict[str, int]:
    """The Python services among a local instance's processes (`stack.stack()["pids"]`)."""
    return {n: pid for n, pid in pids.items() if n in names.SERVICES and pid is not None}


class PySpy:
    """`py-spy record` on named processes from construction to `stop()`."""

    def __init__(self, folder: Path, pids: dict[str, int]) -> None:
        self.folder, self.procs = folder, {}
        folder.mkdir(parents=True, exist_ok=True)
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        for proc_name, pid in pids.items():
            out = folder / f"{proc_name}.txt"
            self.procs[proc_name] = subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(RATE_HZ),
                 "--nonblocking", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=(folder / f"{proc_name}.log").open("wb"),
            )  # fmt: skip

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def summary(self) -> None:
        print(f"\npy-spy profiles in {self.folder}")
        for proc_name in self.procs:
            print(f"\npy-spy, {proc_name}: the ten hottest frames (own and inclusive samples)")
            print(hottest(self.folder / f"{proc_name}.txt"))


def start(folder: Path | None, pids: dict[str, int | None]) -> PySpy | None:
    """A recording of the services among a local instance's processes (`stack.stack()["pids"]`)
    into `folder`, or None when no folder was asked for."""
    return PySpy(folder, service_pids(pids)) if folder is not None else None


def stop(spy: PySpy | None) -> None:
    if spy is not None:
        spy.stop()


def summary(spy: PySpy | None) -> None:
    if spy is not None:
        spy.summary()


def hottest(path: Path, top: int = 10) -> str:
    """The frames with the most samples of their own, with their inclusive count too."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    if not path.exists():
        return f"  (no profile written at {path})"
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        return f"  (no samples in {path})"
    rows = [[f"{n / total:.1%}", f"{inclusive[f] / total:.1%}", f[:110]]
            for f, n in own.most_common(top)]  # fmt: skip
    return f"  {total} samples\n" + table(["own", "incl", "frame"], rows)
