"""The services' own logs on stderr: one line per record, as text or JSON
(`EVENTOS_LOG_FORMAT`), at `EVENTOS_LOG_LEVEL`.

At INFO and above a record's exception is shown as its type and frames only: an exception's
message may quote a message, a prompt or a credential (a database driver's error quotes the
row). At DEBUG, or with `EVENTOS_LOG_EXCEPTIONS=text` (the local instance sets it: its logs are
its operator's own), the full traceback is shown, redacted like every record
(eventos.telemetry.redact): the handler's filter removes tokens and credentials, and the client
libraries log at WARNING at most.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from typing import TextIO

from eventos.telemetry.errors import frames_of, type_name
from eventos.telemetry.redact import RedactingFilter, quiet_client_loggers, redact
from eventos.telemetry.settings import LOG_EXCEPTION_TEXT, LogSettings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def exception_text(record: logging.LogRecord, *, full: bool = False) -> str:
    """The record's exception: full (redacted) at DEBUG or when `full`, type and frames
    above."""
    if not record.exc_info or record.exc_info[0] is None:
        return ""
    exc_type, exc, tb = record.exc_info
    if full or record.levelno <= logging.DEBUG:
        return redact("".join(traceback.format_exception(exc_type, exc, tb)).rstrip())
    lines = [f"  {path}:{line} in {function}" for path, line, function in frames_of(tb)]
    return "\n".join([f"{type_name(exc_type)} (message not shown)", *lines])


class TextFormatter(logging.Formatter):
    """The classic one-line format; exceptions as `exception_text` (in full when
    `full_exceptions`)."""

    def __init__(self, *, full_exceptions: bool = False) -> None:
        super().__init__(TEXT_FORMAT)
        self.full_exceptions = full_exceptions

    def formatException(self, ei: object) -> str:
        return ""

    def format(self, record: logging.LogRecord) -> str:
        # The filter leaves the full (redacted) traceback in `exc_text` for other formatters;
        # this one shows the exception as `exception_text` says, by level.
        saved, record.exc_text = record.exc_text, None
        try:
            line = super().format(record).rstrip()
        finally:
            record.exc_text = saved
        extra = exception_text(record, full=self.full_exceptions)
        return f"{line}\n{extra}" if extra else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message; an exception as its type and
    frames (and its text at DEBUG, or always when `full_exceptions`)."""

    def __init__(self, *, full_exceptions: bool = False) -> None:
        super().__init__()
        self.full_exceptions = full_exceptions

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            doc["exception.type"] = type_name(record.exc_info[0])
            doc["exception.frames"] = [
                f"{p}:{n} in {f}" for p, n, f in frames_of(record.exc_info[2])
            ]
            if self.full_exceptions or record.levelno <= logging.DEBUG:
                doc["exception.text"] = exception_text(record, full=True)
        return json.dumps(doc, ensure_ascii=False, default=str)


def configure_logging(settings: LogSettings, stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one stderr handler of the chosen format, its
    records redacted; the client libraries log at WARNING at most."""
    handler = logging.StreamHandler(stream or sys.stderr)
    full = settings.exceptions == LOG_EXCEPTION_TEXT
    formatter = JsonFormatter if settings.format == "json" else TextFormatter
    handler.setFormatter(formatter(full_exceptions=full))
    handler.addFilter(RedactingFilter())
    quiet_client_loggers()
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level)
    logging.captureWarnings(True)  # Python's warnings in the same format
