"""Starting the cluster's processes with a log each, recording their pids, waiting, stopping."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from components import Component
from layout import Layout, read_json


class ClusterError(RuntimeError):
    """The local cluster failed."""


def wait_for(what: str, check: Callable[[], bool], deadline_s: float, log: Path | None) -> None:
    """Poll `check` until it holds; past the deadline fail naming the condition and the log."""
    end = time.monotonic() + deadline_s
    while not _holds(check):
        if time.monotonic() > end:
            where = f"; see {log}" if log else ""
            raise ClusterError(f"{what}: not true after {deadline_s:.0f} s{where}")
        time.sleep(0.2)


def _holds(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except (OSError, subprocess.SubprocessError):
        return False


def port_taken(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def recorded_pids(layout: Layout) -> dict[str, int]:
    """name -> pid of every process `up` started."""
    return {name: int(str(pid)) for name, pid in read_json(layout.pids_file).items()}


def record_pid(layout: Layout, name: str, pid: int) -> None:
    """Add a started process to the pid file before anything else can fail."""
    pids = recorded_pids(layout)
    pids[name] = pid
    layout.pids_file.write_text(json.dumps(pids, indent=2) + "\n")


def start(layout: Layout, component: Component) -> subprocess.Popen[bytes]:
    """Start one component in its own session, output to logs/<name>.log, pid recorded."""
    for port in component.ports:
        if port_taken(port):
            raise ClusterError(f"{component.name}: port 127.0.0.1:{port} is already taken")
    layout.logs.mkdir(parents=True, exist_ok=True)
    log = layout.logs / f"{component.name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(component.argv, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    record_pid(layout, component.name, process.pid)
    return process


def alive(pid: int) -> bool:
    """Whether the pid is a live process (not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop(pid: int, name: str, grace_s: float = 15) -> None:
    """SIGTERM, then SIGKILL after the grace period; reap it if it is our child."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + wait_s
        while alive(pid) and time.monotonic() < end:
            _reap(pid)
            time.sleep(0.1)
        if not alive(pid):
            break
    _reap(pid)
    if alive(pid):
        raise ClusterError(f"{name} (pid {pid}) survived SIGKILL")


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def shims_of(layout: Layout) -> list[int]:
    """The pids of the shims of this cluster's containerd (their argv names its socket)."""
    socket_path = str(layout.containerd_socket)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and socket_path.encode() in argv:
            pids.append(int(entry.name))
    return pids


def check(argv: list[str], what: str, log: Path | None = None) -> str:
    """Run a command; on failure raise with its output and where to look."""
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        where = f" (see {log})" if log else ""
        raise ClusterError(f"{what} failed{where}: {(result.stderr or result.stdout).strip()}")
    return result.stdout
