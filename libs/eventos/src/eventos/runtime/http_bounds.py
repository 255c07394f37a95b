"""Bounds on every service's HTTP server (SPEC I3): header size and time, body idle time,
requests in flight and open connections, each a setting (`EVENTOS_HTTP_*`).

The header bounds live in the protocol (a subclass of uvicorn's httptools protocol), because by
the time an ASGI app sees a request its headers are already in memory: a connection whose
headers pass `max_header_bytes` is answered 431 and closed as the bytes arrive, and one whose
headers are not complete `header_timeout_s` after its first byte (or after it connected) is
answered 408 and closed (one that sent nothing is closed without an answer).
"""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eventos.settings import HttpBounds

# Probes and scrapes are never refused for load: a busy process is alive and says so.
UNCAPPED_PATHS = frozenset({"/livez", "/readyz", "/metrics"})
RETRY_AFTER_BUSY = "1"
LINGER_S = 2.0


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
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
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

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers, self._header_bytes = True, 0

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            self._in_headers, self._header_bytes = True, 0
            super().on_response_complete()

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


class InFlightCap:
    """At most `limit` requests in flight in this process; beyond it 503 with Retry-After
    (the client retries; nothing was read or stored)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCAPPED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            busy = JSONResponse(
                {"error": f"over {self.limit} requests in flight"},
                status_code=503,
                headers={"Retry-After": RETRY_AFTER_BUSY},
            )
            await busy(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
