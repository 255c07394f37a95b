"""Child processes of the local instance: liveness, identity, and stopping whole process groups.

Each child runs in its own session, so its pid is also its process-group id and a signal to
the group reaches anything it spawned. A recorded pid is only ever signalled while its command
line (and, where /proc exists, its working directory) still match what was recorded: after a
crash the pid may belong to someone else.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eventos.errors import EventOSError

POLL_INTERVAL_S = 0.05


def _zombie(pid: int) -> bool:
    """An exited process nobody reaped yet (an init that does not reap leaves these)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def pid_alive(pid: int) -> bool:
    """True while `pid` runs: not gone, not a zombie (our own zombies are reaped here)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def cmdline(pid: int) -> str:
    """The command line of `pid` joined by spaces, or "" when it is gone."""
    if Path("/proc/self").exists():
        try:
            return (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
                .strip()
            )
        except OSError:
            return ""
    # macOS has no /proc.
    found = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
    return found.stdout.strip()


def cwd(pid: int) -> Path | None:
    """The working directory of `pid` where /proc tells it, else None."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until every pid is gone; returns those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
        alive = [p for p in alive if pid_alive(p)]
    return alive


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group led by `pid` (the pid alone if it leads none)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, sig)


def stop_groups(pids: list[int], timeout: float) -> list[int]:
    """SIGTERM every group at once, SIGKILL what is left after `timeout`; returns the killed."""
    for pid in pids:
        signal_group(pid, signal.SIGTERM)
    stubborn = wait_gone(pids, timeout)
    for pid in stubborn:
        signal_group(pid, signal.SIGKILL)
    wait_gone(stubborn, timeout)
    return stubborn


def stop_child(process: subprocess.Popen[Any] | None, pid_path: Path, timeout: float) -> None:
    """Stop a server we started: SIGTERM, then SIGKILL after `timeout` seconds; its pid file
    goes if it still names this process."""
    if process is None:
        return
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if pid_path.exists() and pid_path.read_text().strip() == str(process.pid):
        pid_path.unlink()


@dataclass(frozen=True)
class Recorded:
    """A child as recorded at spawn time, so a later run can recognise it."""

    pid: int
    cmdline: str
    cwd: str

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "cmdline": self.cmdline, "cwd": self.cwd}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Recorded:
        return cls(int(doc["pid"]), str(doc["cmdline"]), str(doc.get("cwd", "")))

    def still_ours(self) -> bool:
        """Alive and still running what we started, where we started it."""
        if not pid_alive(self.pid) or cmdline(self.pid) != self.cmdline:
            return False
        where = cwd(self.pid)
        return where is None or not self.cwd or where == Path(self.cwd)


class LockHeld(EventOSError):
    """Another process holds the lock."""

    def __init__(self, owner: str):
        self.owner = owner
        super().__init__(f"held by pid {owner}")


@dataclass
class PidLock:
    """An exclusive lock on a file that names its holder; the kernel drops it if we are killed."""

    path: Path
    _fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock now or raise LockHeld naming the holder's pid."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise LockHeld(owner) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
