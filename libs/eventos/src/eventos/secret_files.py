"""Secrets held in files, re-read when they change, each keeping its previous value for an
overlap window (issue 29 point 6: secrets rotate without a restart).

A mounted Kubernetes Secret changes its files in place (the kubelet swaps a symlink), and an
operator of `make run` rewrites a file; an environment variable cannot change in a running
process, so the file form is the one that rotates. A file is read again at most every
`recheck_s` seconds, when it is used; a new content is the current value from then on, and the
value it replaced is still offered as `previous` for `overlap_s` seconds from when this process
saw the change (never less: the window cannot start before the change was seen), so a sender
that still signs with the old secret, or a client that still sends the old token, is not
refused while it switches. A change is logged with the secret's name, never its value.

Every file present is read once when the directory is opened, so a rotation is recognised even
for a secret this process had not used yet. A process started during a window knows only the
new value (the previous one is nowhere to be read).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eventos.errors import SecretUnavailable

log = logging.getLogger(__name__)

MAX_BYTES = 64 * 1024  # a secret file bigger than this is refused, not read whole
MAX_FILES = 1000  # files read when the directory is opened; more are read on first use only
DEFAULT_OVERLAP_S = 24 * 3600.0
DEFAULT_RECHECK_S = 1.0


@dataclass(frozen=True)
class SecretVersions:
    """A secret's current value and, within the overlap window after a rotation, the one
    before it."""

    current: bytes
    previous: bytes | None = None

    def all(self) -> tuple[bytes, ...]:
        """The values a check accepts, the current one first."""
        return (self.current,) if self.previous is None else (self.current, self.previous)


@dataclass
class _Entry:
    value: bytes
    checked_at: float
    previous: bytes | None = None
    previous_until: float = float("-inf")


def read_secret_file(path: Path) -> bytes | None:
    """The file's content without its trailing newline; None when there is no such file;
    SecretUnavailable when it cannot be read or is over MAX_BYTES."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as exc:
        raise SecretUnavailable(
            f"secret file {path.name!r} cannot be read ({exc.strerror})"
        ) from None
    if len(data) > MAX_BYTES:
        raise SecretUnavailable(f"secret file {path.name!r} is over {MAX_BYTES} bytes")
    return data.rstrip(b"\r\n")


class RotatingFile:
    """One secret file (the admin token's): its current value and, for the overlap window after
    a change, the previous one."""

    def __init__(self, path: Path, files: SecretFiles, name: str) -> None:
        self.path, self.files, self.name = path, files, name

    def versions(self) -> SecretVersions:
        """The current (and previous) value; SecretUnavailable if the file is gone or empty."""
        found = self.files.read_path(self.path, self.name)
        if found is None or not found.current:
            raise SecretUnavailable(f"the {self.name} file is missing or empty")
        return found


class SecretFiles:
    """The secret files of one directory (or single files by path), re-read on use at most every
    `recheck_s`, each change logged and its previous value kept for `overlap_s`."""

    def __init__(
        self,
        directory: Path | None,
        overlap_s: float = DEFAULT_OVERLAP_S,
        recheck_s: float = DEFAULT_RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory, self.overlap_s, self.recheck_s = directory, overlap_s, recheck_s
        self._clock = clock
        self._entries: dict[Path, _Entry] = {}
        self._lock = threading.Lock()  # activities may resolve from threads
        if directory is not None and directory.is_dir():
            self._open(directory)

    def _open(self, directory: Path) -> None:
        try:
            paths = sorted(directory.iterdir())
        except OSError as exc:
            log.warning("secrets directory cannot be listed (%s); each secret is read on first "
                        "use, and a rotation before it is not noticed", exc.strerror)  # fmt: skip
            return
        for n, path in enumerate(paths):
            if n >= MAX_FILES:
                log.warning("secrets directory holds over %d files; the rest are read on first "
                            "use, and a rotation before it is not noticed", MAX_FILES)  # fmt: skip
                return
            if not path.name.startswith("."):  # Kubernetes' ..data and timestamped folders
                try:
                    self.read_path(path, path.name)
                except SecretUnavailable as exc:
                    log.warning("%s", exc)

    def read(self, name: str) -> SecretVersions | None:
        """The secret file `name` of the directory, or None when there is none."""
        if self.directory is None or "/" in name or name.startswith("."):
            return None
        return self.read_path(self.directory / name, name)

    def read_path(self, path: Path, name: str) -> SecretVersions | None:
        """The secret in `path` (logged as `name`), or None when there is no such file."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None and now - entry.checked_at < self.recheck_s:
                return self._versions(entry, now)
        value = read_secret_file(path)  # outside the lock: a slow disk holds no other secret
        with self._lock:
            entry = self._entries.get(path)
            if value is None:
                self._entries.pop(path, None)
                return None
            if entry is None:
                entry = self._entries[path] = _Entry(value, now)
            elif value != entry.value:
                # An empty file in between (a rewrite seen half done: truncated, not yet
                # written) is never a previous value; the one before it stays.
                if entry.value:
                    entry.previous, entry.previous_until = entry.value, now + self.overlap_s
                entry.value = value
                log.info("secret %r rotated: the new value is in use; the previous one is "
                            "still accepted for %.0f s", name, self.overlap_s)  # fmt: skip
            entry.checked_at = max(entry.checked_at, now)
            return self._versions(entry, now)

    def _versions(self, entry: _Entry, now: float) -> SecretVersions:
        if entry.previous is not None and now >= entry.previous_until:
            entry.previous = None  # the window is over: only the new value from now on
        return SecretVersions(entry.value, entry.previous)
