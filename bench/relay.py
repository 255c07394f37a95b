"""Relay throughput next to raw Signal-With-Start calls on the same dev server, same run.

    .venv/bin/python bench/relay.py [--streams 300] [--per-stream 32] [--concurrency 32] [--quick]

Starts an embedded PostgreSQL and the Temporal dev server (tier S flags), or takes a fresh
database on EVENTOS_DATABASE_URL's server and TEMPORAL_ADDRESS. Baseline: the raw
rate of Signal-With-Start calls carrying one event each, `--concurrency` at a time, to as many
workflow ids as there are streams (no worker runs: Temporal only records them). Relay: the same
number of events routed into `--streams` streams of one employee, delivered by the real relay
(batches of 16, window 32, leases, delivered_seq commits). Prints calls/s and events/s of both;
targets (issue 12): relay calls/s at least 0.9 of raw calls/s, events/s at least 14x raw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path

from harness import (
    exit_on_signals,
    fresh_database,
    parse_with_quick,
    run_in_temp_folder,
    temporal_server,
)
from temporalio.client import Client
from temporalio.common import Priority, WorkflowIDReusePolicy

from eventos import names
from eventos.bus.inbox import IngressRecord, append
from eventos.db import connect, open_pool
from eventos.db.migrate import migrate
from eventos.delivery.relay import Relay
from eventos.delivery.routing import route_pass
from eventos.employees import lifecycle
from eventos.llm.endpoints import LlmEndpoints
from eventos.runtime.payload_guard import connect as temporal_connect
from eventos.runtime.temporal import TemporalConnection
from eventos.secret_purposes import SecretPurposes
from eventos.settings import DatabaseSettings, TemporalSettings
from eventos.spec.model import load_specs

SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: relaybench}
spec:
  agents: [{name: front, model: {provider: local, name: scripted}}]
  triggers: [{kind: grpc, driver: bench, thread_by: subject}]
"""


def record(stream: int, n: int) -> IngressRecord:
    event_id = uuid.uuid4().hex
    env = {"specversion": "1.0", "id": event_id, "source": "/bench", "type": "msg",
           "subject": f"s{stream}", "data": {"text": f"event {n} of stream {stream}"}}  # fmt: skip
    return IngressRecord("grpc:bench", f"{stream}:{n}", "msg", event_id, env, len(json.dumps(env)))


async def raw_calls(client: Client, streams: int, calls: int, concurrency: int) -> float:
    """Seconds for `calls` Signal-With-Start calls of one event each."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(calls):
        queue.put_nowait(i)
    run = uuid.uuid4().hex[:6]

    async def caller() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            event = {"seq": i, "text": f"event {i}"}
            await client.start_workflow(
                "RawBaseline", {"cursor": 0}, id=f"raw-{run}-{i % streams}", task_queue="raw-bench",
                start_signal="deliver", start_signal_args=[{"items": [event]}],
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                priority=Priority(priority_key=names.C3_INTERNAL, fairness_key="bench"),
            )  # fmt: skip

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return time.perf_counter() - started


async def relay_delivery(
    db: DatabaseSettings, ts: TemporalSettings, total: int
) -> tuple[float, int]:
    """Seconds for the relay to deliver every routed event, and how many calls it made."""
    pool = await open_pool(db, autocommit=True)  # as the relay service's pool
    relay = Relay(pool, TemporalConnection(ts), "bench-relay", task_queue="relay-bench")
    started = time.perf_counter()
    calls = 0
    while True:
        sent = await relay.pass_once()
        calls += sent
        if not sent:
            async with pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT coalesce(sum(delivered_seq), 0) AS n FROM bus_streams"
                )
                if int((await cur.fetchone() or {})["n"]) >= total:
                    break
    elapsed = time.perf_counter() - started
    await pool.close()
    return elapsed, calls


async def run(args: argparse.Namespace, folder: Path) -> None:
    with fresh_database(folder, "eventos_relay") as url, temporal_server(folder) as ts:
        db = DatabaseSettings(url=url, pool_max=40)
        total = args.streams * args.per_stream
        async with await connect(db) as conn:
            await migrate(conn)
            (spec,) = load_specs(SPEC)
            await lifecycle.apply(conn, spec, LlmEndpoints(), SecretPurposes())
            await lifecycle.start(conn, "relaybench")
            await lifecycle.activate(conn, "relaybench")
            for n in range(args.per_stream):
                await append(conn, [record(s, n) for s in range(args.streams)])
            while (await route_pass(conn)).rows:
                pass
        print(f"{total} events routed into {args.streams} streams", flush=True)
        client = await temporal_connect(ts.address, ts.namespace)
        relay_s, relay_calls = await relay_delivery(db, ts, total)
        print(f"relay delivered {total} events in {relay_calls} calls, {relay_s:.1f} s", flush=True)
        raw_s = await raw_calls(client, args.streams, relay_calls, args.concurrency)
        print(f"raw: {relay_calls} Signal-With-Start calls of one event each, {raw_s:.1f} s")
        raw_cps, relay_cps = relay_calls / raw_s, relay_calls / relay_s
        raw_eps, relay_eps = relay_calls / raw_s, total / relay_s
        print(f"\n{'':10} {'calls/s':>9} {'events/s':>9}")
        print(f"{'raw':10} {raw_cps:>9.0f} {raw_eps:>9.0f}")
        print(f"{'relay':10} {relay_cps:>9.0f} {relay_eps:>9.0f}")
        c_ok = "PASS" if relay_cps >= 0.9 * raw_cps else "MISS"
        e_ok = "PASS" if relay_eps >= 14 * raw_eps else "MISS"
        print(f"\nrelay/raw calls/s {relay_cps / raw_cps:.2f} (target ≥ 0.9: {c_ok}); "
              f"events/s {relay_eps / raw_eps:.1f}x (target ≥ 14x: {e_ok})")  # fmt: skip


def main() -> int:
    exit_on_signals()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--per-stream", type=int, default=32, help="≤ 32: no worker consumes")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parse_with_quick(parser, {"streams": 10, "per_stream": 4, "concurrency": 4})
    return run_in_temp_folder("eventos-relay-bench-", lambda folder: run(args, folder))


if __name__ == "__main__":
    raise SystemExit(main())
