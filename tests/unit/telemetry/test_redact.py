"""The redacting log filter (issue 25 point 3): no token-bearing URL part or credential survives
in what a handler shows, from the message, its arguments or an exception's text."""

from __future__ import annotations

import io
import logging

import pytest

from eventos.telemetry.logs import configure_logging
from eventos.telemetry.redact import REDACTED, RedactingFilter, quiet_client_loggers, redact
from eventos.telemetry.settings import LogSettings

BOT = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw-x"
SECRETS = [
    (f"https://api.telegram.org/bot{BOT}/getUpdates?offset=3", BOT),
    (f"https://api.telegram.org/file/bot{BOT}/photos/a.jpg", BOT),
    (f"http://127.0.0.1:9/bot{BOT.replace(':', '%3A')}/sendMessage", BOT.replace(":", "%3A")),
    (f"token {BOT} refused", BOT),
    (
        "https://discord.com/api/v10/webhooks/1122334455/aW50ZXJhY3Rpb246dG9rZW4td2l0aC1kYXRh/"
        "messages/@original",
        "aW50ZXJhY3Rpb246dG9rZW4td2l0aC1kYXRh",
    ),
    ("POST /api/v10/interactions/998877/int-tok-en-3f9a2b7c/callback", "int-tok-en-3f9a2b7c"),
    ("headers={'Authorization': 'Bearer sk-live-abcdef0123456789'}", "sk-live-abcdef0123456789"),
    ("Authorization: Bot MTIzNDU2Nzg5.GhIjKl.mnopqrstuv", "MTIzNDU2Nzg5.GhIjKl.mnopqrstuv"),
    ("https://h.example/x?a=1&token=s3cr3t-value&b=2", "s3cr3t-value"),
    ("host=db port=5432 user=eventos password=hunter2-pg dbname=e", "hunter2-pg"),
    ("https://h.example/x?api_key=k-9f8e7d", "k-9f8e7d"),
    ("postgresql://eventos:pg-pass-42@db.internal:5432/eventos", "pg-pass-42"),
]


@pytest.mark.parametrize(("text", "secret"), SECRETS)
def test_redact_removes_the_secret_and_keeps_the_rest(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and REDACTED in out


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "GET https://api.example.com/bottle/42?page=2 took 12 ms; the bot answered"
    assert redact(text) == text


def record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("httpx", logging.INFO, __file__, 1, msg, args, exc_info)


def test_the_filter_redacts_message_arguments_and_exception_text() -> None:
    try:
        raise RuntimeError(f"connect to https://api.telegram.org/bot{BOT}/getMe failed")
    except RuntimeError as exc:
        rec = record("HTTP Request: %s %s", "POST", f"https://x/bot{BOT}/sendMessage", exc=exc)
    assert RedactingFilter().filter(rec)
    shown = logging.Formatter().format(rec)
    assert BOT not in shown
    assert "HTTP Request: POST https://x/botREDACTED/sendMessage" in shown
    assert "RuntimeError" in shown  # the exception is still there, without the token


def test_service_logging_at_debug_shows_no_token_and_quiets_clients() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("httpx").level)
    out = io.StringIO()
    try:
        configure_logging(LogSettings("text", "DEBUG"), stream=out)
        logging.getLogger("httpx").info("HTTP Request: GET https://x/bot%s/getUpdates", BOT)
        logging.getLogger("eventos.test").debug("retrying https://x/bot%s/getUpdates", BOT)
        try:
            raise ValueError(f"password=hunter2-pg for https://x/bot{BOT}/getMe")
        except ValueError:
            logging.getLogger("eventos.test").debug("failed", exc_info=True)
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        logging.getLogger("httpx").setLevel(saved[2])
    text = out.getvalue()
    assert "HTTP Request" not in text  # httpx logs at WARNING at most
    assert "retrying https://x/botREDACTED/getUpdates" in text
    assert "ValueError" in text and BOT not in text and "hunter2-pg" not in text


def test_quiet_client_loggers_never_lowers_a_stricter_level() -> None:
    logger = logging.getLogger("hpack")
    saved = logger.level
    try:
        logger.setLevel(logging.ERROR)
        quiet_client_loggers()
        assert logger.level == logging.ERROR
        logger.setLevel(logging.DEBUG)
        quiet_client_loggers()
        assert logger.level == logging.WARNING
    finally:
        logger.setLevel(saved)


@pytest.mark.parametrize("text", [
    '> TEXT \'{"op": 2, "d": {"token": "MTE4NzAw.GfAk3d.fake-discord-bot-token-0123"}}\'',
    "identify with MTE4NzAwMDAwMDAwMDAwMDAwMQ.GfAk3d.fake-discord-bot-token-0123456789ab",
])  # fmt: skip
def test_discord_bot_tokens_are_removed(text: str) -> None:
    out = redact(text)
    assert "fake-discord-bot-token" not in out and REDACTED in out
