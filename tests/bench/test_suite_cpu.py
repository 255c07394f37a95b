"""bench/suite_cpu.py reads the kernel's process accounting records (acct_v3): each ended
process's CPU by name, pytest's workers on a line of their own. Turning accounting on is left
to the run (it is the whole machine's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from suite_cpu import ACCT_VERSION, RECORD, WORKERS, by_name, comp_t, records


def record(
    name: str, pid: int, ppid: int, utime: int, stime: int, version: int = ACCT_VERSION
) -> bytes:
    """One record as the kernel writes it (times in comp_t ticks of 1/100 s)."""
    return RECORD.pack(0, version, 0, 0, 0, 0, pid, ppid, 0, 500.0, utime, stime,
                       0, 0, 0, 0, 0, 0, name.encode())  # fmt: skip


def test_comp_t_is_a_13_bit_mantissa_with_a_base_8_exponent() -> None:
    assert comp_t(1234) == 1234
    assert comp_t((2 << 13) | 100) == 100 * 64  # exponent 2: times 8 squared


def test_processes_are_summed_by_name_with_pytests_workers_apart() -> None:
    data = b"".join([
        record("pytest", 10, 1, 50, 10),
        record("python", 11, 10, 2000, 400),  # a worker: pytest's child
        record("python", 12, 11, 80, 20),  # a service the worker started
        record("tokio-rt-worker", 13, 11, (1 << 13) | 100, 0),  # its name is its last thread's
        record("postgres", 14, 1, 30, 30),
    ])  # fmt: skip
    ended = records(data)
    assert [e.name for e in ended] == ["pytest", "python", "python", "tokio-rt-worker", "postgres"]
    assert by_name(ended) == {"pytest": (0.6, 1), WORKERS: (24.0, 1), "python": (1.0, 1),
                              "tokio-rt-worker": (8.0, 1), "postgres": (0.6, 1)}  # fmt: skip


def test_a_record_of_another_version_is_refused() -> None:
    with pytest.raises(ValueError, match="version 2"):
        records(record("python", 1, 0, 1, 1, version=2))
