"""Where a command's CPU goes, by process: the kernel's process accounting over `make test`.

    .venv/bin/python bench/suite_cpu.py [--top 15] [--cores 2] -- make test

As root (Linux, `acct(2)`): turns process accounting on into a temporary file, runs the
command, turns it off, and sums the CPU (user + system, the kernel's record of each process as
it exits, all its threads) of every process that ended meanwhile, by command name, with
pytest's workers (the children of the `pytest` process) on a line of their own. Prints the
total, the wall time, the share of the machine the command used, and the floor its CPU sets on
the wall time with `--cores` cores (CPU / cores: no scheduling beats it). Accounting is global:
whatever else ended on the machine meanwhile is counted too, so run it on a quiet machine.

A process's name is its last thread's: the services (Python with the Temporal client's Rust
runtime or gRPC's) often end as `tokio-rt-worker` or `grpc_global_tim`.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import table

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float), then utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t, in AHZ ticks),
# then the command's name.
RECORD = struct.Struct("=BBHIIIIIIf8H16s")
ACCT_VERSION = 3
AHZ = 100  # the ticks of the records' times
WORKERS = "pytest workers"


@dataclass(frozen=True)
class Ended:
    """One process as the kernel recorded it when it ended."""

    name: str
    pid: int
    ppid: int
    cpu_s: float


def comp_t(value: int) -> int:
    """The kernel's 16-bit float: a 13-bit mantissa and a base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def records(data: bytes) -> list[Ended]:
    out = []
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        f = RECORD.unpack_from(data, offset)
        if f[1] != ACCT_VERSION:
            raise ValueError(f"accounting record version {f[1]} at byte {offset}, expected 3")
        name = f[18].split(b"\0", 1)[0].decode(errors="replace")
        out.append(Ended(name, f[6], f[7], (comp_t(f[10]) + comp_t(f[11])) / AHZ))
    return out


def by_name(ended: list[Ended]) -> dict[str, tuple[float, int]]:
    """CPU seconds and processes per name; pytest's workers (children of `pytest`) apart."""
    pytest = {e.pid for e in ended if e.name == "pytest"}
    cpu: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for e in ended:
        name = WORKERS if e.ppid in pytest else e.name
        cpu[name] += e.cpu_s
        count[name] += 1
    return {name: (cpu[name], count[name]) for name in count}


def accounting(path: str | None) -> None:
    """Turn process accounting on into `path`, or off (None)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(path.encode() if path else None) != 0:
        err = ctypes.get_errno()
        sys.exit(f"acct({path!r}): {os.strerror(err)} (process accounting needs root on Linux)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=15, help="names shown (default 15)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command")
    args = parser.parse_args()
    command = [c for c in args.command if c != "--"] or ["make", "test"]
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as folder:
        path = str(Path(folder) / "pacct")
        Path(path).touch()
        accounting(path)
        began = time.monotonic()
        try:
            code = subprocess.call(command)
        finally:
            wall = time.monotonic() - began
            accounting(None)
        ended = records(Path(path).read_bytes())
    sums = by_name(ended)
    total = sum(cpu for cpu, _ in sums.values())
    ranked = sorted(sums.items(), key=lambda kv: -kv[1][0])[: args.top]
    rows = [[name, f"{cpu:.1f}", n, f"{100 * cpu / total:.1f}%" if total else "-"]
            for name, (cpu, n) in ranked]  # fmt: skip
    print(f"\n{' '.join(command)}: exit {code}, {wall:.0f} s wall; {len(ended)} processes "
          f"ended, {total:.0f} s of CPU ({100 * total / (wall * args.cores):.0f}% of "
          f"{args.cores} cores); the floor it sets: {total / args.cores:.0f} s on {args.cores} "
          "cores")  # fmt: skip
    print(table(["process", "CPU s", "processes", "share"], rows))
    return code


if __name__ == "__main__":
    sys.exit(main())
