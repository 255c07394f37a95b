"""Each pytest session's temporary folders are its own (eventos.testing.plugin): not in
/tmp/pytest-of-<user>, which pytest takes back to mode 0700 at every session's start and so
locked the embedded PostgreSQL's user out of the sessions already running."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from eventos.testing.plugin import SESSIONS_DIR, _ended_sessions


def test_this_sessions_folders_are_its_own(tmp_path: Path) -> None:
    root = Path(tempfile.gettempdir()) / SESSIONS_DIR
    session = tmp_path.relative_to(root).parts[0]  # raises when tmp_path is elsewhere
    pid = int(session[1:].split("-", 1)[0])
    controller = os.getppid() if "PYTEST_XDIST_WORKER" in os.environ else os.getpid()
    assert pid == controller
    assert "pytest-of-" not in str(tmp_path)


def test_only_ended_sessions_are_listed_newest_first(tmp_path: Path) -> None:
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has it
    older, newer = tmp_path / f"s{dead}-older", tmp_path / f"s{dead}-newer"
    for folder in (older, newer, tmp_path / f"s{os.getpid()}-live", tmp_path / "other"):
        folder.mkdir()
    os.utime(older, (1, 1))
    assert _ended_sessions(tmp_path) == [newer, older]
