"""What the loopback fakes of the providers share: a uvicorn server on 127.0.0.1 (a real port),
a clock tests move, sliding-window rate limits, and faults — the next calls of a kind answer
an error, hang, or break off mid-answer (a call whose outcome the client cannot know)."""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import logging
import socket
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from eventos.testing import wait_for

Json = dict[str, Any]
HOLD_MAX_S = 120.0  # a held or hung call is given up by then at the latest


class _HideCuts(logging.Filter):
    """Keep uvicorn quiet about the answers the fakes break off on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "without completing response" not in record.getMessage()


logging.getLogger("uvicorn.error").addFilter(_HideCuts())


@dataclass
class Fault:
    """What one call does instead of its normal answer."""

    kind: Literal["error", "hang", "cut"]
    status: int = 500
    body: Json | None = None  # the error answer
    raw: bytes | None = None  # or a body that is not JSON (a proxy's HTML error page)
    applied: bool = True  # hang/cut: the call took effect before its answer was lost


class Broken(Response):
    """Announce the whole body, send its first half, then drop the connection."""

    def __init__(self, body: bytes) -> None:
        super().__init__(body, 200, media_type="application/json")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = max(len(self.body), 2)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % length)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        half = self.body[: length // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})


class Windows:
    """Sliding windows of send times per key; a limit is (count, seconds), None for none."""

    def __init__(self) -> None:
        self.seen: dict[object, deque[float]] = {}

    def wait(self, key: object, limit: tuple[int, float] | None, now: float) -> float:
        """Seconds until one more send fits this window (0: it fits now)."""
        if limit is None:
            return 0.0
        seen = self.seen.setdefault(key, deque())
        while seen and seen[0] <= now - limit[1]:
            seen.popleft()
        return seen[0] + limit[1] - now if len(seen) >= limit[0] else 0.0

    def take(self, keys: list[object], now: float) -> None:
        for key in keys:
            self.seen.setdefault(key, deque()).append(now)


async def read_params(request: Request) -> Json:
    """Query parameters merged with a JSON, urlencoded or multipart body (ValueError: bad JSON)."""
    params: Json = dict(request.query_params)
    header = request.headers.get("content-type", "")
    kind, raw = header.split(";")[0].strip().lower(), await request.body()
    if request.method != "POST" or not raw:
        return params
    if kind == "application/json":
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        return params | body
    if kind == "application/x-www-form-urlencoded":
        return params | dict(urllib.parse.parse_qsl(raw.decode(errors="replace")))
    if kind == "multipart/form-data":
        head = f"Content-Type: {header}\r\n\r\n".encode()
        form = email.message_from_bytes(head + raw, policy=email.policy.HTTP)
        for part in form.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if isinstance(name, str) and part.get_content_maintype() == "text":
                params[name] = part.get_content()
    return params


async def wait_event(event: asyncio.Event, seconds: float) -> None:
    """Wait for the event, at most `seconds`."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return


class LoopbackFake:
    """Base of a fake: `start`/`stop` on the test's loop, the clock, the fault queues."""

    what = "a fake provider"

    def __init__(self) -> None:
        self.host = "127.0.0.1"  # set before `start` to serve on another address
        self.port = 0
        self.skew = 0.0
        self.faults: dict[object, deque[Fault]] = {}
        self._hung = asyncio.Event()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def now(self) -> float:
        """The fake's clock: wall time plus what `advance` added."""
        return time.time() + self.skew

    def advance(self, seconds: float) -> None:
        """Move the fake's clock on (rate windows, the 24 h rules)."""
        self.skew += seconds

    def routes(self) -> list[Route]:
        raise NotImplementedError

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind((self.host, 0))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        app = Starlette(routes=self.routes())
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=5)  # fmt: skip
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        server = self._server

        async def started() -> bool:
            return server.started

        await wait_for(started, what=f"{self.what} listens")

    async def stop(self) -> None:
        self._hung.set()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.wait_for(self._task, 10)

    def inject(self, key: object, *faults: Fault) -> None:
        """The next calls under `key` get these faults, in order, then normal answers."""
        self.faults.setdefault(key, deque()).extend(faults)

    def release_hangs(self) -> None:
        """Close the connections of the calls hanging now."""
        self._hung.set()
        self._hung = asyncio.Event()

    async def answer(self, key: object, run: Callable[[], Awaitable[Response]]) -> Response:
        """The normal answer `run()`, or what the next fault under `key` makes of it."""
        queue = self.faults.get(key)
        fault = queue.popleft() if queue else None
        if fault is None:
            return await run()
        if fault.kind == "error" and fault.raw is not None:
            return Response(fault.raw, fault.status, media_type="text/html")
        if fault.kind == "error":
            return JSONResponse(fault.body, fault.status)
        body = bytes((await run()).body) if fault.applied else b""
        if fault.kind == "hang":
            await wait_event(self._hung, HOLD_MAX_S)
            return Broken(b"")
        return Broken(body)
