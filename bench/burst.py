"""EG7: a burst to one conversation, appended before the relay runs.

    .venv/bin/python bench/burst.py [--messages 10000] [--quick]

Starts an embedded PostgreSQL and the Temporal dev server (tier S flags), or takes a fresh
database on EVENTOS_DATABASE_URL's server and TEMPORAL_ADDRESS, applies one employee
(local provider), appends N events to ONE conversation and routes them, and only then starts the
relay and the workers (workflows, LLM steps, egress) in this process. It waits until every input
is consumed and prints, per entity run (continue-as-new makes several), the Signals received,
the history events and bytes; then the drain time. Targets (EG7): fewer than 1,000 Signals per
entity run (full batches of 16 make about 625 for 10,000) and history under 10 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from pathlib import Path

import httpx
from harness import (
    exit_on_signals,
    fresh_database,
    parse_with_quick,
    run_in_temp_folder,
    temporal_server,
)

from eventos import names
from eventos.bus.inbox import IngressRecord, append
from eventos.db import connect, open_pool
from eventos.db.migrate import migrate
from eventos.delivery.relay import PER_ENTITY_PER_SECOND, Relay
from eventos.delivery.routing import route_pass
from eventos.employees import lifecycle
from eventos.llm.activity import LlmActivities
from eventos.llm.endpoints import LlmEndpoints
from eventos.llm.worker import llm_worker
from eventos.outbox.keys import OutboxKeys, new_key_entry
from eventos.runtime.payload_guard import connect as temporal_connect
from eventos.runtime.temporal import TemporalConnection
from eventos.secret_purposes import SecretPurposes
from eventos.settings import DatabaseSettings, SecretStore, TemporalSettings
from eventos.spec.model import load_specs
from eventos.workers.activities import DbActivities
from eventos.workers.roles import egress_worker, workflow_worker

SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: burst}
spec:
  agents: [{name: front, model: {provider: local, name: scripted}}]
  triggers: [{kind: grpc, driver: burst}]
"""
SIGNALED = 26  # EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED


def record(n: int) -> IngressRecord:
    event_id = uuid.uuid4().hex
    envelope = {"specversion": "1.0", "id": event_id, "source": "/burst", "type": "msg",
                "data": {"text": f"message {n}"}}  # fmt: skip
    return IngressRecord("grpc:burst", f"b{n}", "msg", event_id, envelope,
                         len(json.dumps(envelope)))  # fmt: skip


async def run(messages: int, folder: Path) -> None:
    with fresh_database(folder, "eventos_burst") as url, temporal_server(folder) as ts:
        db = DatabaseSettings(url=url, pool_max=20)
        async with await connect(db) as conn:
            await migrate(conn)
            (spec,) = load_specs(SPEC)
            await lifecycle.apply(conn, spec, LlmEndpoints(), SecretPurposes())
            await lifecycle.start(conn, "burst")
            await lifecycle.activate(conn, "burst")
            t0 = time.perf_counter()
            for start in range(0, messages, 500):
                await append(conn, [record(n) for n in range(start, min(messages, start + 500))])
            while (await route_pass(conn)).rows:
                pass
            print(f"appended and routed {messages} inputs in {time.perf_counter() - t0:.1f} s")
        await drain(db, ts, messages)


async def drain(db: DatabaseSettings, ts: TemporalSettings, messages: int) -> None:
    pool = await open_pool(db)
    client = await temporal_connect(ts.address, ts.namespace)
    acts = DbActivities(pool, outbox=OutboxKeys.parse(new_key_entry("bench")))
    async with httpx.AsyncClient() as http, contextlib.AsyncExitStack() as stack:
        llm = LlmActivities(http, SecretStore(env={}), pool, endpoints=LlmEndpoints())
        workers = [workflow_worker(client, db=acts), egress_worker(client, acts)]
        workers += [llm_worker(client, k, 8, llm) for k in names.CLASSES]
        for w in workers:
            await stack.enter_async_context(w)
        relay = Relay(pool, TemporalConnection(ts), "burst-relay")
        started = time.perf_counter()
        consumed = 0
        while consumed < messages:
            await relay.pass_once()
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT consumed_seq, entity_id FROM bus_streams")
                row = await cur.fetchone() or {}
            now = int(row.get("consumed_seq", 0))
            if now // 1000 > consumed // 1000:
                took = time.perf_counter() - started
                print(f"  {now} consumed after {took:.0f} s", flush=True)
            consumed = now
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
        await report(client, str(row["entity_id"]), messages, elapsed)
        async with pool.connection() as conn:
            cur = await conn.execute(TURNS_SQL)
            t = await cur.fetchone() or {}
        print(f"turns: {t['turns']} ({t['failed']} failed), {t['per_turn']} inputs per turn, "
              f"{t['turn_s']} s per turn, {t['gap_s']} s between turns")  # fmt: skip
        # Flat cost: the first turns of the conversation against its last ones.
        print(f"time per turn: first 20 {t['first_s']} s, last 20 {t['last_s']} s")
    await pool.close()


# What the turns did: how many, how many failed, their size and pace.
TURNS_SQL = """
WITH t AS (
    SELECT n, status, ended_at - started_at AS took,
           started_at - lag(ended_at) OVER (ORDER BY n) AS gap, count(*) OVER () AS total
    FROM turns
)
SELECT count(*) AS turns, count(*) FILTER (WHERE status <> 'done') AS failed,
       round(extract(epoch FROM avg(took) FILTER (WHERE n <= 20))::numeric, 2) AS first_s,
       round(extract(epoch FROM avg(took) FILTER (WHERE n > total - 20))::numeric, 2) AS last_s,
       round((SELECT count(*) FROM bus_deliveries WHERE status = 'done')::numeric
             / greatest(count(*) FILTER (WHERE status = 'done'), 1), 1) AS per_turn,
       round(extract(epoch FROM avg(took))::numeric, 2) AS turn_s,
       round(extract(epoch FROM avg(gap))::numeric, 2) AS gap_s
FROM t
"""


async def report(client: object, entity_id: str, messages: int, elapsed: float) -> None:
    from temporalio.client import Client

    assert isinstance(client, Client)
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{entity_id}'")]
    rate = messages / elapsed
    print(f"\nEG7 burst of {messages} inputs to one conversation, drained in {elapsed:.1f} s "
          f"({rate:.0f} inputs/s), {len(runs)} entity runs")  # fmt: skip
    # SPEC §8 step 3: at most 4 Signal-With-Start per entity per second, batches of at most 16.
    ceiling = PER_ENTITY_PER_SECOND * names.BATCH_MAX_ITEMS
    print(f"delivery ceiling of one conversation (SPEC §8: {PER_ENTITY_PER_SECOND} Signals/s "
          f"x {names.BATCH_MAX_ITEMS} inputs): {ceiling} inputs/s; drained at "
          f"{rate / ceiling:.0%} of it (issue 12's 150 inputs/s is above it)")  # fmt: skip
    print(f"{'run':>4} {'signals':>8} {'events':>7} {'history MB':>11}")
    worst_signals = worst_bytes = 0
    for i, w in enumerate(sorted(runs, key=lambda r: r.start_time), start=1):
        handle = client.get_workflow_handle(entity_id, run_id=w.run_id)
        events = [e async for e in handle.fetch_history_events()]
        signals = sum(1 for e in events if e.event_type == SIGNALED)
        size = sum(e.ByteSize() for e in events)
        worst_signals, worst_bytes = max(worst_signals, signals), max(worst_bytes, size)
        print(f"{i:>4} {signals:>8} {len(events):>7} {size / 1e6:>11.2f}")
    signals_ok = "PASS" if worst_signals < 1000 else "MISS"
    bytes_ok = "PASS" if worst_bytes < 10e6 else "MISS"
    print(f"\nworst run: {worst_signals} Signals (target < 1000: {signals_ok}), "
          f"{worst_bytes / 1e6:.2f} MB history (target < 10 MB: {bytes_ok})")  # fmt: skip


def main() -> int:
    exit_on_signals()  # SIGTERM unwinds too, so the servers this started are stopped
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    args = parse_with_quick(parser, {"messages": 50})
    return run_in_temp_folder("eventos-burst-", lambda folder: run(args.messages, folder))


if __name__ == "__main__":
    raise SystemExit(main())
