"""Bounds on every service's HTTP server (SPEC I3): header size and time, framing, body time
and rate, requests in flight per class of caller and open connections, each a setting
(`EVENTOS_HTTP_*`).

The header, framing and body-time bounds live in the protocol (a subclass of uvicorn's
httptools protocol), because by the time an ASGI app sees a request its headers are already in
memory, and an app waiting for a body part has no clock of its own on the whole body:
- a connection whose headers pass `max_header_bytes` is answered 431 and closed as the bytes
  arrive, and one whose headers are not complete `header_timeout_s` after its first byte (or
  after it connected) is answered 408 and closed (one that sent nothing is closed without an
  answer);
- framing the parser lets through but no honest client sends (a `Content-Length` with leading
  zeros or more digits than any body could have, several of them) is answered 400 (413 for a
  length of more than `LENGTH_DIGITS_MAX` digits) before the app sees the request; llhttp
  itself refuses signs, non-digits, lists, a length beside `Transfer-Encoding` and unknown
  codings with uvicorn's 400;
- a body not complete `body_timeout_s` after its headers, or arriving slower than
  `body_min_rate` bytes a second on average once `body_rate_grace_s` have passed, is answered
  408 and closed; the app waiting for it sees the client gone, and its request leaves the
  in-flight count at once.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eventos.settings import HttpBounds

# Probes and scrapes are never refused for load: a busy process is alive and says so.
UNCAPPED_PATHS = frozenset({"/livez", "/readyz", "/metrics"})
RETRY_AFTER_BUSY = "1"
LINGER_S = 2.0
# 18 digits is an exabyte: no cap is near it, and int() of it is cheap. More is refused as
# too large without converting it (Python refuses int() of over 4,300 digits with an error).
LENGTH_DIGITS_MAX = 18
_LENGTH = re.compile(rb"0|[1-9][0-9]*")
BODY_RECHECK_S = 1.0  # while reading is paused by the server (the app has not read yet)


def framing_refusal(headers: Sequence[tuple[bytes, bytes]]) -> tuple[bytes, str] | None:
    """The status line and reason to refuse a request's framing with, or None when it is
    sound. `headers` are the request's (names lowercased)."""
    lengths = [v.strip() for k, v in headers if k == b"content-length"]
    codings = [v for k, v in headers if k == b"transfer-encoding"]
    if len(lengths) > 1:
        return b"400 Bad Request", "more than one Content-Length"
    if lengths and codings:
        return b"400 Bad Request", "both Content-Length and Transfer-Encoding"
    if len(codings) > 1:
        return b"400 Bad Request", "more than one Transfer-Encoding"
    if lengths:
        (length,) = lengths
        if not _LENGTH.fullmatch(length):
            return b"400 Bad Request", "Content-Length is not a plain decimal number"
        if len(length) > LENGTH_DIGITS_MAX:
            return b"413 Content Too Large", f"Content-Length over {LENGTH_DIGITS_MAX} digits"
    return None


def _raw_answer(status: bytes, text: str) -> bytes:
    body = text.encode()
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
    )


def bounded_protocol(bounds: HttpBounds) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the header bounds."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _header_bytes = 0
        _in_headers = True
        _header_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _body_started = 0.0
        _body_bytes = 0
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._body_done()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # lingering after a refusal: what still arrives is dropped
            if not self._in_headers:
                super().data_received(data)
                return
            if self._header_timer is None:
                self._arm()
            super().data_received(data)
            if self._in_headers and self.transport is not None:
                # Counted only while headers are incomplete (a chunk that completes them may
                # carry body bytes): a long header grows here chunk by chunk.
                self._header_bytes += len(data)
                if self._header_bytes > bounds.max_header_bytes:
                    self._refuse(b"431 Request Header Fields Too Large", "headers too large")

        # Once refused, the rest of what the parser already holds is dropped too: the app
        # never sees a request whose answer was written.
        def on_message_begin(self) -> None:
            if self._refused:
                return
            super().on_message_begin()
            self._in_headers, self._header_bytes = True, 0

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._in_headers = False
            self._disarm()
            refusal = framing_refusal(self.headers)
            if refusal is not None:
                self._refuse(*refusal)
                return
            super().on_headers_complete()
            self._body_started, self._body_bytes = self.loop.time(), 0
            self._body_timer = self.loop.call_later(self._body_wait(), self._body_check)

        def on_body(self, body: bytes) -> None:
            if self._refused:
                return
            self._body_bytes += len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._body_done()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self._in_headers, self._header_bytes = True, 0
            super().on_response_complete()

        def _body_wait(self) -> float:
            """Seconds until the body is late: its total deadline, or the moment the bytes
            so far fall under the minimum rate, whichever comes first."""
            by_rate = bounds.body_rate_grace_s + self._body_bytes / bounds.body_min_rate
            due = min(bounds.body_timeout_s, by_rate)
            return max(0.0, self._body_started + due - self.loop.time())

        def _body_done(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _body_check(self) -> None:
            self._body_timer = None
            if self.transport.is_closing():
                return
            if self.flow.read_paused:
                # The server holds the client back (the app has not read what came): that
                # time is not the client's to make up.
                self._body_started += BODY_RECHECK_S
                self._body_timer = self.loop.call_later(BODY_RECHECK_S, self._body_check)
                return
            wait = self._body_wait()
            if wait > 0:  # more arrived since the timer was set: the body is on time
                self._body_timer = self.loop.call_later(wait, self._body_check)
                return
            cycle = self.cycle
            if cycle is not None and cycle.response_started:
                # Answered already (before reading it all): only the connection is left.
                self.transport.close()
                return
            if cycle is not None:
                # The app waiting for the body hears the client is gone (and anything it then
                # answers is dropped): its request ends and leaves the in-flight count.
                cycle.disconnected = True
                cycle.message_event.set()
            self._refuse(b"408 Request Timeout", "request body too slow")

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(bounds.header_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _timed_out(self) -> None:
            self._header_timer = None
            if not self._in_headers:
                return
            if self._header_bytes == 0:
                # Nothing of a request arrived: an idle connection is closed without an answer
                # (a client that opened it ahead of time sees a plain close, as at keep-alive's).
                self.transport.close()
            else:
                self._refuse(b"408 Request Timeout", "request headers timed out")

        def send_400_response(self, msg: str) -> None:
            if not self._refused:  # a refusal was written already: no second answer
                super().send_400_response(msg)

        def _refuse(self, status: bytes, text: str) -> None:
            """Answer, half-close, and drop further input for a moment before closing: closing
            with unread input would reset the connection and lose the answer."""
            self._disarm()
            if self._refused or self.transport.is_closing():
                return
            self._refused = True
            self.transport.write(_raw_answer(status, text))
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

    return BoundedHttpToolsProtocol


@dataclass(frozen=True)
class CapClass:
    """A class of callers with its own in-flight cap: the requests `matches` says are its."""

    name: str
    limit: int
    matches: Callable[[Scope], bool]


def under(*prefixes: str) -> Callable[[Scope], bool]:
    """Requests whose path starts with one of `prefixes`."""
    return lambda scope: scope["path"].startswith(prefixes)


class InFlightCap:
    """At most `limit` requests in flight in this process for each class of caller (the first
    of `classes` a request matches, else the default class of `limit`); beyond a class's cap
    503 with Retry-After (the client retries; nothing was read or stored). A class at its cap
    refuses only its own callers: slow webhook senders filling theirs leave the owner API and
    the event streams answering."""

    def __init__(self, app: ASGIApp, limit: int, classes: Sequence[CapClass] = ()) -> None:
        self.app = app
        self.classes = [*classes, CapClass("http", limit, lambda scope: True)]
        self.in_flight = dict.fromkeys((c.name for c in self.classes), 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCAPPED_PATHS:
            await self.app(scope, receive, send)
            return
        cap = next(c for c in self.classes if c.matches(scope))
        if self.in_flight[cap.name] >= cap.limit:
            busy = JSONResponse(
                {"error": f"over {cap.limit} requests in flight"},
                status_code=503,
                headers={"Retry-After": RETRY_AFTER_BUSY},
            )
            await busy(scope, receive, send)
            return
        self.in_flight[cap.name] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[cap.name] -= 1
