"""Ports for the local servers (`make run`, the tests' stacks): picked now, bound moments later."""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from collections.abc import Collection, Iterable
from pathlib import Path

# The kernel hands outgoing connections local ports from this range (Linux's default when the
# file cannot be read). A port picked here is bound by a server seconds later (a service
# starting on a loaded machine): picked from the ephemeral range, it could meanwhile become
# some connection's local port, and the server would fail to bind ("Address already in use").
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
LISTEN_FLOOR = 10000  # above the well-known and registered ports servers here use
LISTEN_CEILING = 32767  # the Temporal server keeps its members' ports in a smallint column
PICK_ATTEMPTS = 64
# Picked ports are reserved on this machine: a picker (a test worker's stack, another session's,
# `make run`) skips a port another picker reserved, free or not, until the reservation ages out.
# Without it two pickers could both find a port free in the moment before either server binds
# it, and one server fails "Address already in use" (seen with several test sessions at once).
# An hour covers a test stack's life; `make run`, which may run for days and restarts every
# process on the same ports, renews its reservations as it goes (renew). The folder is
# `$TMPDIR/eventos-ports-<uid>`, found when first used (not at import: Temporal's workflow sandbox
# refuses `tempfile` in a module a workflow's file imports); a test may set RESERVATIONS.
RESERVATIONS: Path | None = None
RESERVED_S = 3600.0


def reservations() -> Path:
    """The folder of this machine's reservations, created when missing."""
    folder = RESERVATIONS or Path(tempfile.gettempdir()) / f"eventos-ports-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections."""
    try:
        low, high = (int(n) for n in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def free_port(host: str = "127.0.0.1", taken: Collection[int] = ()) -> int:
    """A TCP port free right now on `host` and not in `taken`, below the kernel's ephemeral
    range (so no outgoing connection takes it before the server that was given it binds it) and
    below 32768; a random one, so that processes picking at once rarely pick the same. Where no
    such range is left, any free port."""
    highest = min(ephemeral_range()[0] - 1, LISTEN_CEILING)
    if highest > LISTEN_FLOOR:
        for _ in range(PICK_ATTEMPTS):
            port = random.randint(LISTEN_FLOOR, highest)
            if port in taken or not _bindable(host, port) or not reserve(port):
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def reserve(port: int, now: float | None = None) -> bool:
    """Claim `port` for RESERVED_S among this machine's pickers; False when another holds it.
    A reservation that aged out is taken over by the one picker whose rename of it wins."""
    folder = reservations()
    path = folder / str(port)
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            pass
        try:
            age = (time.time() if now is None else now) - path.stat().st_mtime
            if age < RESERVED_S:
                return False
            os.rename(path, path.with_name(f"{port}.stale.{os.getpid()}.{random.random()}"))
        except FileNotFoundError:
            return False  # another picker took it over (or let it go) just now
        for stale in folder.glob(f"{port}.stale.*"):
            stale.unlink(missing_ok=True)
    return False


def renew(held: Iterable[int], now: float | None = None) -> None:
    """Reserve the ports a running instance holds for another RESERVED_S from `now` (its
    processes restart on them, however long it runs)."""
    folder = reservations()
    stamp = time.time() if now is None else now
    for port in held:
        path = folder / str(port)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.utime(path, (stamp, stamp))
