"""HTTP/1.1 keep-alive load generator for signed webhook POSTs, run as its own process.

`python bench/loadgen.py '<json config>'` prints one JSON result line on stdout and progress
on stderr. Two modes:

- `rate`: open loop. Request i is due at start + i/rate and is sent then on an idle
  connection (a new one when none is idle); its latency runs from when it was due to the
  end of its response, so a slow server cannot hide its queueing (no coordinated omission).
- `closed`: `concurrency` connections, each sending its next request when the last answer
  arrived; figures cover only the window after the warm-up.

Requests are built by hand (a ~1 KB JSON body, a unique X-Event-Id, an HMAC-SHA256
signature) and answers parsed by hand, so the generator stays cheap next to the servers it
drives; it reports its own CPU so a reader can tell whether it was the limit.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import math
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import uvloop

REQUEST_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 512
MAX_REQUESTS = 2_000_000  # a hard bound on any one run, whatever the duration says
PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True)
class Config:
    """What to send, where, and how."""

    host: str
    port: int
    mode: str  # "rate" or "closed"
    duration: float
    paths: list[str]
    secret: str
    signature_header: str
    id_prefix: str
    rate: float = 50.0
    concurrency: int = 64
    warmup: float = 1.0
    body_bytes: int = 1024
    label: str = "load"


class RequestBuilder:
    """Signed webhook requests with unique ids and a body of about `body_bytes`."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.secret = cfg.secret.encode()
        self.host = f"{cfg.host}:{cfg.port}"
        probe = self._body("x" * 40, 0, "")
        self.pad = "p" * max(0, cfg.body_bytes - len(probe))

    def _body(self, event_id: str, seq: int, pad: str) -> bytes:
        doc = {
            "id": event_id,
            "type": "deploy.finished",
            "seq": seq,
            "service": "checkout",
            "environment": "production",
            "commit": hashlib.sha1(event_id.encode()).hexdigest(),
            "author": {"name": "Bench Driver", "email": "bench@example.invalid"},
            "notes": pad,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    def build(self, i: int) -> bytes:
        event_id = f"{self.cfg.id_prefix}{i}"
        body = self._body(event_id, i, self.pad)
        sig = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
        path = self.cfg.paths[i % len(self.cfg.paths)]
        head = (
            f"POST /hooks/{path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"X-Event-Id: {event_id}\r\n{self.cfg.signature_header}: sha256={sig}\r\n\r\n"
        )
        return head.encode() + body


class Connection:
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.reusable = True

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        """Send one request; (status, body) of its answer."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at < 0:
            raise ValueError("answer without Content-Length")
        end = lower.index(b"\r\n", at + 2)
        body = await self.reader.readexactly(int(lower[at + 17 : end]))
        if b"\r\nconnection: close" in lower:
            self.reusable = False
        return status, body

    def close(self) -> None:
        self.reusable = False
        self.writer.close()


@dataclass
class Tally:
    """Answers and latencies."""

    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    accepted: int = 0
    duplicate: int = 0
    sent: int = 0
    latencies: list[float] = field(default_factory=list)
    window_ok: int = 0
    window_done: int = 0

    def answer(self, status: int, body: bytes) -> None:
        self.statuses[status] += 1
        if status == 200:
            if b'"accepted"' in body:
                self.accepted += 1
            elif b'"duplicate"' in body:
                self.duplicate += 1

    def window(self, status: int, latency: float) -> None:
        self.window_done += 1
        self.window_ok += status == 200
        self.latencies.append(latency)


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, math.ceil(p * len(sorted_values)) - 1))  # nearest rank
    return sorted_values[k]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def log(cfg: Config, message: str) -> None:
    print(f"         [{cfg.label}] {message}", file=sys.stderr, flush=True)


class Pool:
    """Idle connections, and a bound on how many exist."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.idle: list[Connection] = []
        self.opened = 0
        self.peak = 0
        self._freed = asyncio.Condition()

    async def get(self) -> Connection:
        while not self.idle and self.opened >= MAX_CONNECTIONS:
            async with self._freed:
                await self._freed.wait()
        while self.idle:
            conn = self.idle.pop()
            if not conn.reader.at_eof():
                return conn
            # The server closed it while idle (its idle or header timeout), as servers do:
            # like any client pool, drop it instead of sending into a closed connection.
            conn.close()
            self.opened -= 1
        self.opened += 1
        self.peak = max(self.peak, self.opened)
        try:
            return await Connection.open(self.cfg.host, self.cfg.port)
        except BaseException:
            self.opened -= 1
            raise

    async def put(self, conn: Connection) -> None:
        if conn.reusable:
            self.idle.append(conn)
        else:
            conn.close()
            self.opened -= 1
        async with self._freed:
            self._freed.notify()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()


async def run_rate(cfg: Config) -> dict[str, Any]:
    """Open loop at `cfg.rate` for `cfg.duration` seconds."""
    # perf_counter, not loop.time(): uvloop's clock moves in whole milliseconds.
    clock = time.perf_counter
    build = RequestBuilder(cfg)
    tally = Tally()
    pool = Pool(cfg)
    for conn in [await pool.get() for _ in range(8)]:  # connected before the clock starts
        await pool.put(conn)
    total = min(MAX_REQUESTS, int(cfg.rate * cfg.duration))
    send_lag: list[float] = []

    async def one(i: int, due: float) -> None:
        conn = await pool.get()
        send_lag.append(clock() - due)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                status, body = await conn.roundtrip(build.build(i))
        except Exception as exc:
            tally.errors[type(exc).__name__] += 1
            conn.close()
            await pool.put(conn)
            return
        tally.answer(status, body)
        tally.window(status, clock() - due)
        await pool.put(conn)

    tasks: set[asyncio.Task[None]] = set()
    cpu0, start = _cpu(), clock() + 0.1
    next_report = start + PROGRESS_EVERY_S
    for i in range(total):
        due = start + i / cfg.rate
        if due > clock():
            await asyncio.sleep(due - clock())
        task = asyncio.create_task(one(i, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        tally.sent += 1
        if clock() >= next_report:
            log(cfg, f"{clock() - start:5.1f}s sent {tally.sent}, answered {tally.window_done}")
            next_report += PROGRESS_EVERY_S
    if tasks:
        await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_S + 5)
    wall = clock() - start
    cpu = _cpu() - cpu0
    pool.close()
    result = summary(cfg, tally, wall, cpu)
    result["max_send_lag_ms"] = 1000 * max(send_lag, default=0.0)
    result["connections"] = pool.peak
    return result


async def run_closed(cfg: Config) -> dict[str, Any]:
    """`cfg.concurrency` connections back to back for warm-up + duration seconds."""
    loop = asyncio.get_running_loop()
    build = RequestBuilder(cfg)
    tally = Tally()
    counter = itertools.count()
    begin = loop.time()
    measure_from = begin + cfg.warmup
    end = measure_from + cfg.duration
    marks: dict[str, float] = {}

    async def worker() -> None:
        conn: Connection | None = None
        while loop.time() < end:
            i = next(counter)
            if i >= MAX_REQUESTS:
                break
            if conn is None or not conn.reusable:
                try:
                    conn = await Connection.open(cfg.host, cfg.port)
                except OSError as exc:
                    tally.errors[type(exc).__name__] += 1
                    await asyncio.sleep(0.1)
                    continue
            sent = time.perf_counter()
            tally.sent += 1
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    status, body = await conn.roundtrip(build.build(i))
            except Exception as exc:
                tally.errors[type(exc).__name__] += 1
                conn.close()
                continue
            tally.answer(status, body)
            done = loop.time()
            if measure_from <= done <= end:
                tally.window(status, time.perf_counter() - sent)
        if conn is not None:
            conn.close()

    async def meter() -> None:
        await asyncio.sleep(max(0.0, measure_from - loop.time()))
        marks["cpu0"] = _cpu()
        while loop.time() < end:
            await asyncio.sleep(min(PROGRESS_EVERY_S, max(0.0, end - loop.time())))
            elapsed = loop.time() - measure_from
            log(cfg, f"{elapsed:5.1f}s {tally.window_ok / max(elapsed, 1e-9):7.0f} ok/s")
        marks["cpu1"] = _cpu()

    workers = [asyncio.create_task(worker()) for _ in range(cfg.concurrency)]
    await asyncio.gather(meter(), *workers)
    cpu = marks["cpu1"] - marks["cpu0"]
    result = summary(cfg, tally, cfg.duration, cpu)
    result["connections"] = cfg.concurrency
    return result


def summary(cfg: Config, tally: Tally, wall: float, cpu: float) -> dict[str, Any]:
    lat = sorted(tally.latencies)
    return {
        "mode": cfg.mode,
        "sent": tally.sent,
        "accepted": tally.accepted,
        "duplicate": tally.duplicate,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "errors": dict(tally.errors),
        "window_s": wall,
        "window_done": tally.window_done,
        "window_ok": tally.window_ok,
        "ok_per_s": tally.window_ok / wall if wall > 0 else 0.0,
        "p50_ms": 1000 * percentile(lat, 0.50),
        "p99_ms": 1000 * percentile(lat, 0.99),
        "max_ms": 1000 * (lat[-1] if lat else float("nan")),
        "generator_cpu_pct": 100.0 * cpu / wall if wall > 0 else 0.0,
    }


async def main(cfg: Config) -> dict[str, Any]:
    return await (run_rate(cfg) if cfg.mode == "rate" else run_closed(cfg))


if __name__ == "__main__":
    config = Config(**json.loads(sys.argv[1]))
    print(json.dumps(uvloop.run(main(config))), flush=True)
