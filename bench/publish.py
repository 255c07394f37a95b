"""gRPC `EventIngress.Publish` throughput: one stream, then eight concurrent streams.

    .venv/bin/python bench/publish.py [--quick] [--events N] [--streams K] [--window W]

Starts a durable embedded PostgreSQL (unless EVENTOS_DATABASE_URL is set), the real ingress
service, the router (unless --no-router), and an employee with one `grpc` trigger per
stream. Each phase publishes --events events in total (unique dedupe keys, ~1 KB
CloudEvents envelopes): first over one stream, then spread over --streams streams, each on
its own gRPC channel and driver id, keeping at most --window events unacknowledged per
stream (SPEC §6.3 allows 1,000). An Ack comes only after its append committed.

Prints events/s per phase and the ratio K-streams/1-stream, and checks that the ACCEPTED
acks equal the rows in bus_ingress.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from harness import (
    NAN,
    CpuMeter,
    ServiceProc,
    Stack,
    apply_employee,
    counts,
    cpu_summary,
    fmt,
    interrupt_guard,
    others_cpu,
    parse_with_quick,
    progress,
    scalar,
    start_ingress,
    start_router,
    table,
    wait_routed,
)

from eventos import names
from eventos.v1 import ingress_pb2, ingress_pb2_grpc

STREAM_DEADLINE_S = 150.0  # every Publish call has a deadline; a phase cannot run longer
PROGRESS_EVERY_S = 5.0
WARMUP_EVENTS = 1000


@dataclass
class StreamResult:
    """What one Publish stream got back."""

    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    first_sent: float = NAN
    last_ack: float = NAN
    out_of_order: int = 0
    error: str = ""


@dataclass(frozen=True)
class PhaseResult:
    name: str
    streams: int
    events: int
    results: list[StreamResult]
    wall: float
    client_cpu_pct: float
    cpu: dict[str, float]

    def status(self, name: str) -> int:
        return sum(r.statuses[name] for r in self.results)

    @property
    def acked(self) -> int:
        return sum(sum(r.statuses.values()) for r in self.results)

    @property
    def per_s(self) -> float:
        return self.acked / self.wall if self.wall > 0 else NAN

    def latency_ms(self, p: float) -> float:
        lat = sorted(x for r in self.results for x in r.latencies)
        if not lat:
            return NAN
        return 1000 * lat[min(len(lat) - 1, max(0, math.ceil(p * len(lat)) - 1))]  # nearest rank


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--events", type=int, default=20_000, help="events per phase (20000)")
    p.add_argument("--streams", type=int, default=8, help="streams in the second phase (8)")
    p.add_argument("--window", type=int, default=1000, help="unacked events per stream (1000)")
    p.add_argument("--envelope-bytes", type=int, default=1024, help="envelope size (1024)")
    p.add_argument("--no-router", action="store_true", help="do not run the router")
    p.add_argument("--profile", type=Path, help="run ingress under cProfile, write stats here")
    args = parse_with_quick(p, {"events": 400}, argv)
    if args.events < args.streams or args.streams < 1 or not 1 <= args.window <= 1000:
        p.error("need --events >= --streams >= 1 and 1 <= --window <= 1000")
    return args


def envelope(driver: str, event_id: str, size: int) -> bytes:
    """A CloudEvents 1.0 JSON envelope of about `size` bytes."""
    doc: dict[str, Any] = {
        "specversion": "1.0",
        "id": event_id,
        "source": f"/drivers/{driver}",
        "type": "bench.message.received",
        "datacontenttype": "application/json",
        "data": {"from": "customer-42", "subject": "bench", "text": ""},
    }
    pad = max(0, size - len(json.dumps(doc, separators=(",", ":"))))
    doc["data"]["text"] = "t" * pad
    return json.dumps(doc, separators=(",", ":")).encode()


def driver_token(driver: str) -> str:
    """The bench's token of a driver (stable per driver id, so a rerun needs no state)."""
    return f"bench-token-{driver}-0123456789"


def driver_secrets(drivers: list[str]) -> dict[str, str]:
    """Each driver's token under its default reference `driver-<id>` (SecretStore naming)."""
    env = {}
    for d in drivers:
        ref = names.driver_token_ref(d)
        env["EVENTOS_SECRET_" + ref.upper().replace("-", "_").replace(".", "_")] = driver_token(d)
    return env


async def publish_stream(
    target: str, driver: str, events: int, prefix: str, window: int, size: int
) -> StreamResult:
    """Publish `events` events over one stream on its own channel; keep `window` unacked."""
    res = StreamResult()
    slots = asyncio.Semaphore(window)
    sent_at: dict[int, float] = {}
    source = f"grpc:{driver}"

    async def requests() -> Any:
        for seq in range(1, events + 1):
            await slots.acquire()
            key = f"{prefix}{seq}"
            ev = ingress_pb2.DriverEvent(
                driver_id=driver,
                seq=seq,
                source_key=source,
                dedupe_key=key,
                type="bench.message.received",
                envelope=envelope(driver, key, size),
            )
            sent_at[seq] = time.perf_counter()
            if seq == 1:
                res.first_sent = sent_at[seq]
            yield ev

    async with grpc.aio.insecure_channel(target) as channel:
        stub = ingress_pb2_grpc.EventIngressStub(channel)
        auth = (("authorization", f"Bearer {driver_token(driver)}"),)
        call = stub.Publish(requests(), timeout=STREAM_DEADLINE_S, metadata=auth)
        expected = 1
        try:
            async for ack in call:
                now = time.perf_counter()
                res.statuses[ingress_pb2.Ack.Status.Name(ack.status)] += 1
                res.latencies.append(now - sent_at.pop(ack.seq, now))
                res.out_of_order += ack.seq != expected
                expected = ack.seq + 1
                res.last_ack = now
                slots.release()
        except grpc.aio.AioRpcError as exc:
            res.error = f"{exc.code().name}: {exc.details()}"
    return res


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run_phase(
    name: str, target: str, drivers: list[str], events: int, prefix: str, args: argparse.Namespace
) -> tuple[list[StreamResult], float, float]:
    """All streams of one phase at once; (results, wall seconds, client CPU %)."""
    per = [events // len(drivers) + (i < events % len(drivers)) for i in range(len(drivers))]
    cpu0 = _cpu()
    tasks = [
        asyncio.create_task(
            publish_stream(target, d, n, f"{prefix}{i}-", args.window, args.envelope_bytes)
        )
        for i, (d, n) in enumerate(zip(drivers, per, strict=True))
    ]
    started = time.perf_counter()
    while not all(t.done() for t in tasks):
        await asyncio.wait(tasks, timeout=PROGRESS_EVERY_S)
        if not all(t.done() for t in tasks):
            progress(f"  {name}: {time.perf_counter() - started:5.1f}s running")
    results = [t.result() for t in tasks]
    cpu = _cpu() - cpu0
    first = min(r.first_sent for r in results)
    last = max(r.last_ack for r in results)
    wall = last - first if last == last and first == first else NAN
    return results, wall, 100.0 * cpu / max(time.perf_counter() - started, 1e-9)


class Bench:
    """The stack and the phases of one run."""

    def __init__(self, args: argparse.Namespace, stack: Stack) -> None:
        self.args = args
        self.stack = stack
        self.tag = "p" + secrets.token_hex(3)
        self.url = ""
        self.ingress: ServiceProc | None = None
        self.router: ServiceProc | None = None
        self.drivers = [f"{self.tag}-d{i}" for i in range(args.streams)]
        self.phases: list[PhaseResult] = []
        self.warm_accepted = 0

    def start(self) -> None:
        self.url = self.stack.database()
        if not self.args.no_router:
            self.router = start_router(self.stack, self.url, wait=False)
        self.ingress = start_ingress(
            self.stack,
            self.url,
            router=self.router,
            env=driver_secrets(self.drivers),
            profile_to=self.args.profile,
            wait=False,
        )
        self.stack.wait_ready(self.ingress, *([self.router] if self.router else []))
        name = f"bench-{self.tag}"
        triggers = "\n".join(f"    - {{kind: grpc, driver: {d}}}" for d in self.drivers)
        spec = (
            f"apiVersion: eventos/v1\nkind: Employee\nmetadata: {{name: {name}}}\nspec:\n"
            f"  agents:\n    - {{name: main, model: {{provider: local, name: scripted}}}}\n"
            f"  triggers:\n{triggers}\n"
        )
        apply_employee(self.ingress.base_url, spec, name)
        progress(f"{len(self.drivers)} grpc triggers declared (run tag {self.tag})")

    @property
    def target(self) -> str:
        assert self.ingress is not None
        return f"127.0.0.1:{self.ingress.grpc_port}"

    def meter(self) -> CpuMeter:
        assert self.ingress is not None
        pids = {"ingress": (self.ingress.pid, False)}
        if self.router is not None:
            pids["router"] = (self.router.pid, False)
        pids["postgres"] = (self.stack.postgres_pid, True)
        return CpuMeter(pids)

    def phase(self, name: str, drivers: list[str], prefix: str) -> PhaseResult:
        if self.router is not None:
            waited = wait_routed(self.url, f"grpc:{self.tag}-%")
            if waited > 0.5:
                progress(f"router needed {waited:.1f}s to route the previous phase's backlog")
        progress(f"{name}: {self.args.events} events over {len(drivers)} stream(s)")
        meter = self.meter()
        meter.start()
        results, wall, client_cpu = asyncio.run(
            run_phase(name, self.target, drivers, self.args.events, prefix, self.args)
        )
        ph = PhaseResult(name, len(drivers), self.args.events, results, wall, client_cpu,
                         meter.stop())  # fmt: skip
        progress(
            f"{name}: {ph.per_s:.0f} events/s, ack p50 {ph.latency_ms(0.5):.1f} ms; CPU: "
            f"client {client_cpu:.0f}%, {cpu_summary(ph.cpu)}"
        )
        for r in results:
            if r.error:
                progress(f"  a stream failed: {r.error}")
        return ph

    def run(self) -> None:
        warm = self.args.events if self.args.quick else WARMUP_EVENTS
        progress("warm-up")
        results, _, _ = asyncio.run(
            run_phase("warm-up", self.target, self.drivers[:1], min(warm, 1000),
                      f"{self.tag}-warm-", self.args)
        )  # fmt: skip
        self.warm_accepted = sum(r.statuses["ACCEPTED"] for r in results)
        self.phases.append(self.phase("1 stream", self.drivers[:1], f"{self.tag}-one-"))
        many = f"{len(self.drivers)} streams"
        self.phases.append(self.phase(many, self.drivers, f"{self.tag}-many-"))
        if self.router is not None:
            waited = wait_routed(self.url, f"grpc:{self.tag}-%", timeout=120.0)
            progress(f"router finished routing {waited:.1f}s after the last phase")


def report(bench: Bench) -> bool:
    """Print the figures; False when the commit check failed."""
    a = bench.args
    rows = []
    for ph in bench.phases:
        errors = sum(1 for r in ph.results if r.error)
        disorder = sum(r.out_of_order for r in ph.results)
        rows.append([
            ph.name, ph.events, ph.acked, ph.status("ACCEPTED"), ph.status("DUPLICATE"),
            ph.status("REJECTED"), errors, disorder, fmt(ph.per_s, 0), fmt(ph.latency_ms(0.5)),
            fmt(ph.latency_ms(0.99)), fmt(ph.client_cpu_pct, 0), fmt(ph.cpu.get("ingress", NAN), 0),
            fmt(ph.cpu.get("router", NAN), 0), fmt(ph.cpu.get("postgres", NAN), 0),
            fmt(others_cpu(ph.cpu, ph.client_cpu_pct), 0),
        ])  # fmt: skip
    print()
    print(
        f"EventIngress.Publish -- envelope {a.envelope_bytes} B, window {a.window}/stream, "
        f"router {'off' if a.no_router else 'on'}, PostgreSQL fsync on, 2 cores shared by all"
    )
    print(table(
        ["phase", "events", "acked", "accepted", "dup", "rejected", "failed streams",
         "out of order", "events/s", "ack p50 ms", "ack p99 ms", "client CPU%", "ingress CPU%",
         "router CPU%", "PG CPU%", "others CPU%"],
        rows,
    ))  # fmt: skip
    print("  CPU% is of one core (200% = the whole machine); others = processes not ours.")
    one, many = bench.phases
    ratio = many.per_s / one.per_s if one.per_s else NAN
    print(f"  {many.name}/1 stream throughput: {fmt(ratio, 2)}x")
    print()
    accepted = bench.warm_accepted + sum(ph.status("ACCEPTED") for ph in bench.phases)
    rows_in = scalar(
        bench.url, "SELECT count(*) FROM bus_ingress WHERE source_key LIKE %s",
        (f"grpc:{bench.tag}-%",),
    )  # fmt: skip
    dup = sum(ph.status("DUPLICATE") for ph in bench.phases)
    ok = rows_in == accepted and dup == 0
    state = "OK" if ok else "FAILED: an acknowledged event is missing or duplicated"
    print(f"commit check: {accepted} ACCEPTED acks (+{dup} duplicate), {rows_in} rows -> {state}")
    for ph in bench.phases:
        errs = [r.error for r in ph.results if r.error]
        if errs:
            print(f"  {ph.name}: {counts(Counter(errs))}")
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with interrupt_guard(), Stack() as stack:
        bench = Bench(args, stack)
        bench.start()
        bench.run()
        return 0 if report(bench) else 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
