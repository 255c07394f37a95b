"""Error reports (SPEC §13): each logged exception as its type, its traceback frames (file,
line, function; no locals, no source text, no message) and how often it happened.

A logging handler counts exceptions by (type, frames) between two exports; each export sends
one log record per distinct error with `error.count`, and an empty body. The exception's
message is never read: it may quote a message, a prompt or a credential.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

MAX_DISTINCT = 256  # errors kept between two exports; more are counted as dropped
MAX_FRAMES = 50  # the innermost frames of a deep traceback
# Loggers whose exceptions are not reported: the exporter's own (a collector that is down
# would otherwise be reported through itself, forever).
SILENT = ("opentelemetry", "eventos.telemetry")

Frame = tuple[str, int, str]


@dataclass(frozen=True)
class ErrorReport:
    """One distinct error and how many times it happened since the last export."""

    exception_type: str
    frames: tuple[Frame, ...]
    count: int

    def attributes(self) -> dict[str, str | int]:
        """The record's attributes, every key on the allowlist's `log` list."""
        attrs: dict[str, str | int] = {
            "exception.type": self.exception_type,
            "exception.stacktrace": "\n".join(f"{f}:{n} in {fn}" for f, n, fn in self.frames),
            "error.count": self.count,
        }
        if self.frames:
            path, line, function = self.frames[-1]
            attrs.update({"code.filepath": path, "code.lineno": line, "code.function": function})
        return attrs


def type_name(exc_type: type[BaseException]) -> str:
    """`module.Qualname`, or the bare name of a builtin."""
    if exc_type.__module__ == "builtins":
        return exc_type.__qualname__
    return f"{exc_type.__module__}.{exc_type.__qualname__}"


def code_path(filename: str) -> str:
    """A source path without the machine's directories: from the package on."""
    for marker in ("/site-packages/", "/src/", "/lib/python"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    return filename.rsplit("/", 1)[-1]


def frames_of(tb: TracebackType | None) -> tuple[Frame, ...]:
    """The traceback's frames as (path, line, function), innermost last."""
    summary = traceback.extract_tb(tb)[-MAX_FRAMES:]
    return tuple((code_path(f.filename), f.lineno or 0, f.name) for f in summary)


class ErrorCounter(logging.Handler):
    """Counts the exceptions of log records at WARNING and above by (type, frames)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[tuple[str, tuple[Frame, ...]], int] = {}
        self.dropped = 0
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if not record.exc_info or record.exc_info[0] is None:
            return
        if record.name.startswith(SILENT):
            return
        exc_type, _, tb = record.exc_info
        key = (type_name(exc_type), frames_of(tb))
        with self._guard:
            if key in self.counts or len(self.counts) < MAX_DISTINCT:
                self.counts[key] = self.counts.get(key, 0) + 1
            else:
                self.dropped += 1

    def take(self) -> list[ErrorReport]:
        """The errors counted since the last call, and reset."""
        with self._guard:
            counts, self.counts = self.counts, {}
            dropped, self.dropped = self.dropped, 0
        if dropped:
            logging.getLogger(__name__).warning("%d error(s) over %d distinct not reported",
                                                dropped, MAX_DISTINCT)  # fmt: skip
        return [ErrorReport(t, frames, n) for (t, frames), n in counts.items()]


def install(counter: ErrorCounter) -> Callable[[], None]:
    """Count every logged exception of the process; returns the undo."""
    root = logging.getLogger()
    root.addHandler(counter)
    return lambda: root.removeHandler(counter)
