"""Secrets never reach a log (SPEC §17 "Secrets keep to their purpose"; issue 25 point 3).

Two layers. The HTTP, WebSocket and HTTP/2 client libraries log at WARNING at most
(`quiet_client_loggers`): at INFO httpx writes every request's full URL, and a Telegram Bot API
URL carries the bot token in its path; at DEBUG websockets writes every frame, the Discord
gateway's IDENTIFY (with the bot token) among them, and hpack every header. And a filter on
the root handlers (`RedactingFilter`) rewrites what any record would show, message, arguments,
exception and stack text, with token-bearing parts replaced by `REDACTED`:

- Telegram Bot API paths `/bot<token>/…` and `/file/bot<token>/…`, and a bare bot token
  (`123456789:AA…`) anywhere;
- Discord webhook and interaction tokens, `/webhooks/<id>/<token>` and
  `/interactions/<id>/<token>/…`;
- `Authorization:` values and `Bearer`/`Basic`/`Bot` credentials;
- `password=`, `token=`, `secret=`, `api_key=`, `access_token=`, `sig=` style parameters (query
  strings, libpq conninfo, form bodies);
- URL userinfo (`scheme://user:password@host`).

A pattern is a backstop, never the plan: code does not log secrets in the first place.
"""

from __future__ import annotations

import logging
import re
import traceback

REDACTED = "REDACTED"

# Loggers of client libraries that write URLs, headers or frames below WARNING.
CLIENT_LOGGERS = (
    "httpx",
    "httpcore",
    "h11",
    "h2",
    "hpack",
    "urllib3",
    "websockets",
    "aiosmtplib",
    "aioimaplib",
    "openai",
)

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Telegram: /bot<token>/method and /file/bot<token>/path (the token may be percent-encoded).
    (
        re.compile(r"(?i)(/(?:file/)?bot)(?=[^/\s?#\"'<>]*(?::|%3a))[^/\s?#\"'<>]+"),
        rf"\1{REDACTED}",
    ),
    # A bot token on its own: digits, a colon, 30+ URL-safe characters.
    (re.compile(r"\b\d{5,}:[A-Za-z0-9_-]{30,}"), REDACTED),
    # Discord: /webhooks/<id>/<token> and /interactions/<id>/<token>/callback.
    (re.compile(r"(/(?:webhooks|interactions)/[^/\s?#\"'<>]+/)[^/\s?#\"'<>]+"), rf"\1{REDACTED}"),
    # Authorization headers, as a header line, a dict entry or a tuple.
    (
        re.compile(
            r"(?i)(authorization[\"']?\s*[:=,]\s*[\"']?)(?:(?:bearer|basic|bot)\s+)?"
            r"[^\s\"',;}\])]+"
        ),
        rf"\1{REDACTED}",
    ),
    # A credential after its scheme: 8+ characters, one at least a digit or a symbol (so "the
    # bot answered" stays as written).
    (
        re.compile(
            r"\b(Bearer|Basic|Bot|bearer|basic)(\s+)(?=[A-Za-z0-9._~+/=-]*[0-9._~+/=-])"
            r"[A-Za-z0-9._~+/=-]{8,}"
        ),
        rf"\1\2{REDACTED}",
    ),
    # key=value credentials: query strings, conninfo, form bodies.
    (
        re.compile(
            r"(?i)\b((?:pass(?:word|wd)?|pwd|token|access_token|refresh_token|id_token|"
            r"api_?key|apikey|secret|client_secret|sig|signature|auth)=)[^&\s#\"',;]+"
        ),
        rf"\1{REDACTED}",
    ),
    # The same keys as JSON or a dict: "token": "…" (the Discord gateway's IDENTIFY).
    (
        re.compile(
            r"(?i)([\"'](?:[a-z_]*token|pass(?:word|wd)?|[a-z_]*secret|api_?key)[\"']\s*:\s*"
            r"[\"'])[^\"']+"
        ),
        rf"\1{REDACTED}",
    ),
    # A Discord bot token or a JWT on its own: three dot-separated base64url parts.
    (re.compile(r"\b[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{20,}"), REDACTED),
    # URL userinfo: scheme://user[:password]@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"'<>]+@"), rf"\1{REDACTED}@"),
)


def redact(text: str) -> str:
    """The text with every token-bearing part replaced by `REDACTED`."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites a record in place so no handler after it shows a credential: the message is
    formatted with its arguments and redacted, and an exception or stack is formatted and
    redacted into the record's text (formatters use `exc_text` when it is set)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: show the template, never fail a log call
            message = str(record.msg)
        record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def quiet_client_loggers(level: int = logging.WARNING) -> None:
    """The client libraries' loggers at WARNING at most, whatever the root level."""
    for name in CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < level:
            logger.setLevel(level)


def install_redaction(logger: logging.Logger | None = None) -> RedactingFilter:
    """A redacting filter on every handler of `logger` (the root by default), once each."""
    target = logger or logging.getLogger()
    found = RedactingFilter()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(found)
    return found


def protect_logs() -> None:
    """For a process that configures its own logging (the CLI, the local instance): clients at
    WARNING at most, and redaction on the root's handlers and on Python's last-resort one."""
    quiet_client_loggers()
    install_redaction()
    last = logging.lastResort
    if last is not None and not any(isinstance(f, RedactingFilter) for f in last.filters):
        last.addFilter(RedactingFilter())
