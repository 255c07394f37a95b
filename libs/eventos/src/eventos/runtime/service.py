"""What every service shares: /livez, /readyz and /metrics over HTTP, an optional gRPC
server with standard health, background loops, and a clean stop on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import uvicorn
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from eventos import telemetry
from eventos.runtime import build, metrics
from eventos.runtime.http_bounds import CapClass, InFlightCap, bounded_protocol
from eventos.settings import HttpBounds, ReleaseSettings

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Awaitable[None]]
GrpcRegistrar = Callable[[grpc.aio.Server], None]
READINESS_TIMEOUT_S = 2.0
READINESS_LOG_EVERY_S = 60.0  # a failing check logs its exception at warning this often
# How long a /readyz probe waits for the answer: the checks (database, Temporal) run one after
# the other, each under READINESS_TIMEOUT_S. A probe that gives up sooner drops a true answer
# that a loaded machine is slow to give, and may never see one.
READYZ_PROBE_TIMEOUT_S = 2 * READINESS_TIMEOUT_S + 1.0
LOOP_STOP_S = 10.0  # a stopping service waits this long for its loops
CANCEL_AGAIN_S = 0.5


def health_routes(name: str, checks: dict[str, ReadinessCheck]) -> list[BaseRoute]:
    """The three routes every service serves; `/livez` and `/readyz` name the release."""
    last_logged: dict[str, float] = {}
    running = build.running_release().as_json()
    drill = ReleaseSettings.from_env().drill_readiness_failure

    def failure(check_name: str, exc: Exception) -> str:
        # /readyz is reachable by probes and scrapers: it names the dependency with a fixed
        # word and never carries exception text (hosts, users, SQL); the log keeps the detail,
        # at warning at most once a minute per check (probes ask every few seconds).
        word = "timeout" if isinstance(exc, TimeoutError) else "unavailable"
        now = time.monotonic()
        level = logging.DEBUG
        if now - last_logged.get(check_name, -READINESS_LOG_EVERY_S) >= READINESS_LOG_EVERY_S:
            last_logged[check_name] = now
            level = logging.WARNING
        log.log(level, "%s: readiness check %s %s: %s: %s", name, check_name, word,
                type(exc).__name__, exc)  # fmt: skip
        return word

    async def livez(request: Request) -> Response:
        return JSONResponse({"service": name, "status": "alive", "release": running})

    async def readyz(request: Request) -> Response:
        failed: dict[str, str] = {}
        for check_name, check in checks.items():
            try:
                await asyncio.wait_for(check(), READINESS_TIMEOUT_S)
            except Exception as exc:
                failed[check_name] = failure(check_name, exc)
        if drill:
            failed["drill"] = "injected"
        status = 503 if failed else 200
        body = {"service": name, "ready": not failed, "failed": failed, "release": running}
        return JSONResponse(body, status_code=status)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return [Route("/livez", livez), Route("/readyz", readyz), Route("/metrics", metrics)]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one)."""
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only for TCP, and
    # without it a response split in two writes waits for the peer's delayed ACK (~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], grace_s: float) -> None:
    """Cancel the tasks and wait for them, cancelling again every half second: Python 3.11's
    `asyncio.wait_for` (used by libraries such as psycopg_pool) can swallow a cancellation
    that races with its inner future finishing, and a task that missed one must still stop.
    Tasks still running after `grace_s` are logged and left behind. The caller cancelled
    meanwhile (its own stopper cancels it again) still waits for them, then is cancelled."""
    pending = {t for t in tasks if not t.done()}
    deadline = time.monotonic() + grace_s
    cancelled = False
    while pending and time.monotonic() < deadline:
        for t in pending:
            t.cancel()
        try:
            _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
        except asyncio.CancelledError:
            cancelled = True
            pending = {t for t in pending if not t.done()}
    if pending:
        log.warning("%d task(s) did not stop within %.0f s: %s", len(pending), grace_s,
                    ", ".join(t.get_name() for t in pending))  # fmt: skip
    if cancelled:
        raise asyncio.CancelledError


@dataclass(frozen=True)
class GrpcServerOptions:
    """How a service's gRPC server is bounded and secured (channel arguments, TLS, RPCs)."""

    options: tuple[tuple[str, int], ...] = ()
    credentials: grpc.ServerCredentials | None = None
    max_concurrent_rpcs: int | None = None


class PrefixDispatch:
    """HTTP requests under one of `prefixes` go straight to its bare ASGI app (a hot path
    with no framework layer); everything else to `app`."""

    def __init__(self, app: ASGIApp, prefixes: list[tuple[str, ASGIApp]]) -> None:
        self.app = app
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            for prefix, raw in self.prefixes:
                if path.startswith(prefix):
                    await raw(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class LoopFailed(RuntimeError):
    """A service stopped because one of its background loops failed or ended on its own."""


class ListenFailed(RuntimeError):
    """A service could not listen on one of its ports (taken, or an address it cannot bind)."""


@dataclass
class Service:
    """One running service: its HTTP app (Starlette `routes`, and `raw_routes` by path prefix),
    gRPC server and background loops."""

    name: str
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int | None = None
    routes: list[BaseRoute] = field(default_factory=list)
    raw_routes: list[tuple[str, ASGIApp]] = field(default_factory=list)
    checks: dict[str, ReadinessCheck] = field(default_factory=dict)
    grpc_registrars: list[GrpcRegistrar] = field(default_factory=list)
    grpc_server: GrpcServerOptions = field(default_factory=GrpcServerOptions)
    loops: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    http_bounds: HttpBounds = field(default_factory=HttpBounds)
    # Classes of callers with their own in-flight caps (the rest share `max_in_flight`).
    in_flight_classes: list[CapClass] = field(default_factory=list)
    bound_http_port: int = 0
    bound_grpc_port: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _started: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> ASGIApp:
        app = Starlette(routes=[*health_routes(self.name, self.checks), *self.routes])
        return PrefixDispatch(app, self.raw_routes) if self.raw_routes else app

    def stop(self) -> None:
        """Ask the service to stop (what SIGTERM does)."""
        self._stop.set()

    async def started(self) -> None:
        """Wait until the service listens."""
        await self._started.wait()

    async def run(self, *, install_signals: bool = True) -> None:
        """Serve until stop() or a signal; then stop loops, servers and resources in order."""
        metrics.register(self.name)  # this service's families on /metrics
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        grpc_server, port = None, self.grpc_port
        try:
            grpc_server = await self._start_grpc()
            port = self.http_port
            sock = bind(self.host, self.http_port)
        except (OSError, RuntimeError) as exc:  # grpc says RuntimeError, socket OSError
            if grpc_server is not None:
                await grpc_server.stop(grace=None)
            for fn in self.on_stop:  # what the service opened before (pools, clients)
                await fn()
            raise ListenFailed(f"{self.name}: cannot listen on {self.host}:{port}: {exc}") from exc
        self.bound_http_port = sock.getsockname()[1]
        b = self.http_bounds
        config = uvicorn.Config(
            InFlightCap(self.app(), b.max_in_flight, self.in_flight_classes),
            http=bounded_protocol(b),
            limit_concurrency=b.max_connections,
            timeout_keep_alive=b.keep_alive_s,
            log_level="warning",
            lifespan="off",
            access_log=False,
            # Nothing reads the client's address, so no layer rewrites it from X-Forwarded-For.
            proxy_headers=False,
        )
        http = uvicorn.Server(config)
        http_task = asyncio.create_task(http.serve(sockets=[sock]))
        tasks = [asyncio.create_task(fn()) for fn in [metrics.watch_event_loop_lag, *self.loops]]
        self._started.set()
        log.info("%s ready: http=%s grpc=%s", self.name, self.bound_http_port, self.bound_grpc_port)
        stop_wait = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
        failure = None
        for t in done:
            if t is stop_wait:
                continue
            failure = f"{t.get_coro().__qualname__} " + (  # type: ignore[union-attr]
                f"failed: {t.exception()!r}" if t.exception() is not None else "ended"
            )
            log.error("%s: a loop %s", self.name, failure, exc_info=t.exception())
        await cancel_and_wait(tasks, LOOP_STOP_S)
        stop_wait.cancel()
        http.should_exit = True
        if grpc_server is not None:
            await grpc_server.stop(grace=2.0)
        with contextlib.suppress(asyncio.CancelledError):
            await http_task
        for fn in self.on_stop:
            await fn()
        log.info("%s stopped", self.name)
        if failure is not None:
            raise LoopFailed(f"{self.name}: a loop {failure}")

    async def _start_grpc(self) -> grpc.aio.Server | None:
        if self.grpc_port is None:
            return None
        opts = self.grpc_server
        server = grpc.aio.server(
            options=list(opts.options), maximum_concurrent_rpcs=opts.max_concurrent_rpcs
        )
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        for register in self.grpc_registrars:
            register(server)
        address = f"{self.host}:{self.grpc_port}"
        if opts.credentials is None:
            self.bound_grpc_port = server.add_insecure_port(address)
        else:
            self.bound_grpc_port = server.add_secure_port(address, opts.credentials)
        await server.start()
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        return server


def run_main(service: str, main: Coroutine[Any, Any, None]) -> None:
    """Run a service's `main` on uvloop, every service's event loop (cheaper per request and
    per socket event than the stock loop; Temporal workers run on it too), with its logging
    and telemetry (eventos.telemetry) set up first and flushed last."""
    with telemetry.started(service):
        try:
            uvloop.run(main)
        except (LoopFailed, ListenFailed) as exc:
            # Exit non-zero: a supervisor (kubelet, systemd, `eventos.local`) sees a failure
            # and restarts the service, never a clean stop.
            log.error("%s", exc)
            raise SystemExit(1) from exc
