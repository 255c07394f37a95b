"""Child-process helpers of the local instance: recognising leftovers, stopping groups, the lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventos.local import ports
from eventos.local.instance import LocalStack, StackError
from eventos.local.processes import LockHeld, PidLock, Recorded, pid_alive, stop_groups
from eventos.local.restarts import Restarts, exit_text
from eventos.local.service_process import ServiceProcess
from eventos.testing import wait_for_sync

# A child that says it is up, then waits for a signal (the test kills it).
SLEEPER = [sys.executable, "-c", "import signal; print('up', flush=True); signal.pause()"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True);"
    " signal.pause()",
]


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    children: list[subprocess.Popen[bytes]] = []
    yield children
    for child in children:
        child.kill()
        child.wait()


def spawn(children: list[subprocess.Popen[bytes]], argv: list[str], cwd: Path) -> int:
    child = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, start_new_session=True)
    children.append(child)
    return child.pid


def test_a_recorded_child_is_ours_only_while_it_runs_what_we_started(
    spawned: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    pid = spawn(spawned, SLEEPER, tmp_path)
    # Popen returns before the child has exec'd: until then its command line is ours (pytest's).
    stdout = spawned[0].stdout
    assert stdout is not None and stdout.readline() == b"up\n"
    assert Recorded(pid, " ".join(SLEEPER), str(tmp_path)).still_ours()
    assert not Recorded(pid, "something else", str(tmp_path)).still_ours()
    if Path("/proc/self").exists():
        assert not Recorded(pid, " ".join(SLEEPER), "/elsewhere").still_ours()
    spawned[0].kill()
    spawned[0].wait()
    assert not Recorded(pid, " ".join(SLEEPER), str(tmp_path)).still_ours()


def test_stop_groups_kills_what_ignores_sigterm(
    spawned: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    polite = spawn(spawned, SLEEPER, tmp_path)
    stubborn = spawn(spawned, STUBBORN, tmp_path)
    stdout = spawned[1].stdout
    assert stdout is not None and stdout.readline() == b"up\n"  # its handler is in place
    assert stop_groups([polite, stubborn], timeout=0.5) == [stubborn]
    wait_for_sync(lambda: not pid_alive(polite) and not pid_alive(stubborn), timeout=5)


def test_the_lock_names_its_holder(tmp_path: Path) -> None:
    first, second = PidLock(tmp_path / "lock"), PidLock(tmp_path / "lock")
    first.acquire()
    with pytest.raises(LockHeld) as held:
        second.acquire()
    assert held.value.owner == str(os.getpid())
    first.release()
    second.acquire()
    second.release()


def test_a_second_instance_on_the_same_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".eventos").mkdir()
    running = PidLock(tmp_path / ".eventos" / "lock")
    running.acquire()
    try:
        with pytest.raises(StackError, match=f"another local instance \\(pid {os.getpid()}\\)"):
            LocalStack(tmp_path, say=lambda line: None).start()
    finally:
        running.release()


@pytest.mark.parametrize(
    ("ran_s", "restarts", "delay_s", "attempt"), [(1.0, 5, 30.0, 6), (120.0, 5, 1.0, 1)]
)
def test_the_restart_delay_grows_only_while_a_service_keeps_exiting_soon_after_its_start(
    tmp_path: Path, ran_s: float, restarts: int, delay_s: float, attempt: int
) -> None:
    """A crash loop backs off up to 30 s; a service killed after a minute of work comes back
    after 1 s however often it was restarted before (the fault run kills each many times)."""
    said: list[str] = []
    stack = LocalStack(tmp_path, say=said.append)
    svc = ServiceProcess("router", 1, None, tmp_path / "router.log", restarts=Restarts(restarts))
    svc.process = subprocess.Popen([sys.executable, "-c", "pass"])
    svc.process.wait()
    stack.services["router"] = svc
    svc.started_at = time.monotonic() - ran_s
    stack.check_children()
    assert svc.restarts.due_at - time.monotonic() == pytest.approx(delay_s, abs=0.5)
    assert f"router (pid {svc.pid}) exited with code 0; restart {attempt} in {delay_s:g}s" in said


@pytest.mark.parametrize(
    ("returncode", "said"),
    [(0, "exited with code 0"), (3, "exited with code 3"), (-9, "was killed by SIGKILL"),
     (-15, "was killed by SIGTERM"), (-200, "was killed by signal 200")],
)  # fmt: skip
def test_an_exit_is_said_with_its_code_or_signal(returncode: int, said: str) -> None:
    assert exit_text(returncode) == said


def test_a_running_instance_renews_its_ports_reservations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "RESERVATIONS", tmp_path / "reservations")
    stack = LocalStack(tmp_path, say=lambda line: None)
    svc = ServiceProcess("router", 23456, 23457, tmp_path / "router.log")
    svc.process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                   stdin=subprocess.PIPE)  # fmt: skip
    stack.services["router"] = svc
    aged = time.time() - ports.RESERVED_S + 60  # a minute before another picker may take them
    reservations = [ports.reservations() / str(port) for port in (23456, 23457)]

    def stamps() -> list[float]:
        return [path.stat().st_mtime for path in reservations]

    try:
        assert stack.ports() == [23456, 23457]
        for path in reservations:
            assert ports.reserve(int(path.name))
            os.utime(path, (aged, aged))
        stack.check_children()  # not due yet
        assert stamps() == [aged, aged]
        monkeypatch.setattr(stack, "_renew_at", 0.0)
        stack.check_children()
        assert all(stamp > aged + ports.RESERVED_S / 2 for stamp in stamps())
    finally:
        svc.process.kill()
        svc.process.wait()
