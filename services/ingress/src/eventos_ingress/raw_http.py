"""`/hooks` as a bare ASGI handler: the request read straight from the ASGI scope and a JSON
answer sent straight to the server, with no framework layer between (at saturation Starlette's
routing, middleware and response objects cost about a sixth of a webhook's CPU).

Everything else the ingress serves stays on Starlette (`eventos.runtime.service.PrefixDispatch`
sends only this prefix here).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)


class ClientDisconnect(Exception):
    """The client went away before its body was read."""


class HookRequest:
    """What the webhook handler reads of a request: its path below the prefix, method, query
    string, headers (names lowercased; a repeated header keeps its last value) and body
    messages."""

    __slots__ = ("headers", "method", "path", "query", "receive")

    def __init__(self, scope: Scope, receive: Receive, prefix: str) -> None:
        self.path: str = scope["path"][len(prefix) :]
        self.method: str = scope["method"]
        self.query: bytes = scope.get("query_string", b"")
        self.headers: dict[str, str] = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
        }
        self.receive = receive


@dataclass(frozen=True)
class Answer:
    """A JSON answer (a text one when `body` is a string, as Meta's verification wants); `send`
    writes it to the ASGI server in one body message."""

    status_code: int
    body: dict[str, Any] | str
    headers: dict[str, str] | None = None

    async def send(self, send: Send) -> None:
        if isinstance(self.body, str):
            content, kind = self.body.encode(), b"text/plain; charset=utf-8"
        else:
            content = json.dumps(self.body, ensure_ascii=False, separators=(",", ":")).encode()
            kind = b"application/json"
        headers = [(b"content-type", kind),
                   (b"content-length", str(len(content)).encode())]  # fmt: skip
        for k, v in (self.headers or {}).items():
            headers.append((k.lower().encode("latin-1"), v.encode("latin-1")))
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content})


HookHandler = Callable[[HookRequest], Awaitable[Answer]]


def hook_app(prefix: str, handle: HookHandler) -> ASGIApp:
    """The ASGI app serving `prefix…` with `handle`; an unexpected error answers 500."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            answer = await handle(HookRequest(scope, receive, prefix))
        except Exception:
            log.exception("webhook handler failed")
            answer = Answer(500, {"error": "internal error"})
        await answer.send(send)

    return app
