"""EG7: a burst to one conversation, appended before the relay runs.

    .venv/bin/python bench/conversation_burst.py [--messages 10000] [--quick] [--no-fail]

Starts an embedded PostgreSQL and the Temporal dev server (tier S flags), or takes a fresh
database on EVENTOS_DATABASE_URL's server and TEMPORAL_ADDRESS, applies one employee
(local provider), appends N events to ONE conversation and routes them, and only then starts the
relay and the workers (workflows, LLM steps, egress) in this process. It waits until every input
is consumed and prints, per entity run (continue-as-new makes several), the Signals received,
the history events and bytes; then the drain time. Targets (EG7): fewer than 1,000 Signals in
the entity's run, counted over its continue-as-new runs (full batches of 16 make about 625 for
10,000), and history under 10 MB in each run (Temporal's own bound on a run's history). The
driver exits 3 when one is missed (`--no-fail`: 0; a `--quick` smoke run exits 0 whatever its
figures say). `tests/integration/delivery/test_eg7_burst.py` runs the same parts in `make
test` and fails on either.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from harness import (
    Targets,
    add_no_fail,
    exit_on_signals,
    fresh_database,
    local_employee,
    parse_with_quick,
    run_in_temp_folder,
    temporal_server,
)
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from eventos import names
from eventos.bus.inbox import IngressRecord, append
from eventos.db import Conn, connect, open_pool
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

EMPLOYEE = "burst"
SIGNALS_MAX = 1000  # EG7: fewer than this many Signals in the entity's run (all its runs)
HISTORY_MAX_BYTES = 10_000_000  # EG7: each run's history under 10 MB
DRAIN_TIMEOUT_S = 1800.0  # a drain that has not finished by then has stalled
RUNS_MAX = 1000  # a continue-as-new chain longer than this is not followed further
SIGNALED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
CONTINUED_AS_NEW = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW


def spec(employee: str) -> str:
    """One employee on the instant local model, with one gRPC driver named after it."""
    return local_employee(employee, f"[{{kind: grpc, driver: {employee}}}]")


def record(employee: str, n: int) -> IngressRecord:
    event_id = uuid.uuid4().hex
    envelope = {"specversion": "1.0", "id": event_id, "source": "/burst", "type": "msg",
                "data": {"text": f"message {n}"}}  # fmt: skip
    return IngressRecord(f"grpc:{employee}", f"b{n}", "msg", event_id, envelope,
                         len(json.dumps(envelope)))  # fmt: skip


async def prepare(conn: Conn, employee: str, messages: int) -> None:
    """Apply and start `employee`, append `messages` inputs to its one conversation and route
    them all: the burst is in the database before any relay runs."""
    (doc,) = load_specs(spec(employee))
    await lifecycle.apply(conn, doc, LlmEndpoints(), SecretPurposes())
    await lifecycle.start(conn, employee)
    await lifecycle.activate(conn, employee)
    for start in range(0, messages, 500):
        await append(conn, [record(employee, n) for n in range(start, min(messages, start + 500))])
    while (await route_pass(conn)).rows:
        pass


async def run(messages: int, folder: Path, targets: Targets) -> None:
    with fresh_database(folder, "eventos_burst") as url, temporal_server(folder) as ts:
        db = DatabaseSettings(url=url, pool_max=20)
        async with await connect(db) as conn:
            await migrate(conn)
            t0 = time.perf_counter()
            await prepare(conn, EMPLOYEE, messages)
            print(f"appended and routed {messages} inputs in {time.perf_counter() - t0:.1f} s")
        pool = await open_pool(db)
        client = await temporal_connect(ts.address, ts.namespace)
        outbox = OutboxKeys.parse(new_key_entry("bench"))
        entity_id, elapsed = await drain(pool, client, ts, messages, outbox=outbox)
        await report(client, entity_id, messages, elapsed, targets)
        async with pool.connection() as conn:
            cur = await conn.execute(TURNS_SQL)
            t = await cur.fetchone() or {}
        print(f"turns: {t['turns']} ({t['failed']} failed), {t['per_turn']} inputs per turn, "
              f"{t['turn_s']} s per turn, {t['gap_s']} s between turns")  # fmt: skip
        # Flat cost: the first turns of the conversation against its last ones.
        print(f"time per turn: first 20 {t['first_s']} s, last 20 {t['last_s']} s")
        await pool.close()


async def drain(
    pool: AsyncConnectionPool[Conn],
    client: Client,
    ts: TemporalSettings,
    messages: int,
    *,
    outbox: OutboxKeys,
    queue: str = names.WORKFLOW_QUEUE,
    timeout_s: float = DRAIN_TIMEOUT_S,
    say: Callable[[str], object] = print,
) -> tuple[str, float]:
    """Start the workers on `queue` (workflows, LLM steps, egress) and a relay, and pass until
    the conversation has consumed `messages` inputs; its entity's workflow id and the seconds
    the drain took. Raises TimeoutError past `timeout_s`."""
    acts = DbActivities(pool, outbox=outbox)
    async with httpx.AsyncClient() as http, contextlib.AsyncExitStack() as stack:
        llm = LlmActivities(http, SecretStore(env={}), pool, endpoints=LlmEndpoints())
        workers = [workflow_worker(client, queue, acts), egress_worker(client, acts, queue)]
        workers += [llm_worker(client, k, 8, llm, workflow_queue=queue) for k in names.CLASSES]
        for w in workers:
            await stack.enter_async_context(w)
        relay = Relay(pool, TemporalConnection(ts), f"burst-relay-{queue}", task_queue=queue)
        started = time.perf_counter()
        consumed, row = 0, {}
        while consumed < messages:
            took = time.perf_counter() - started
            if took > timeout_s:
                raise TimeoutError(f"{consumed} of {messages} consumed after {took:.0f} s")
            await relay.pass_once()
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT consumed_seq, entity_id FROM bus_streams")
                row = await cur.fetchone() or {}
            now = int(row.get("consumed_seq", 0))
            if now // 1000 > consumed // 1000:
                say(f"  {now} consumed after {took:.0f} s")
            consumed = now
            await asyncio.sleep(0.05)
        return str(row["entity_id"]), time.perf_counter() - started


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


@dataclass(frozen=True)
class RunCost:
    """What one run of an entity cost: its Signals (and by name), history events and bytes."""

    run_id: str
    signals: int
    events: int
    bytes: int
    by_name: dict[str, int]


async def entity_runs(client: Client, entity_id: str) -> list[RunCost]:
    """Every run of the entity's current chain, first to last, followed from the first run
    through each continue-as-new (from the histories, not Visibility)."""
    handle = client.get_workflow_handle(entity_id)
    info = (await handle.describe()).raw_description.workflow_execution_info
    run_id, runs = info.first_run_id or info.execution.run_id, list[RunCost]()
    while run_id and len(runs) < RUNS_MAX:
        events = [e async for e in client.get_workflow_handle(entity_id, run_id=run_id)
                  .fetch_history_events()]  # fmt: skip
        by_name = collections.Counter(
            e.workflow_execution_signaled_event_attributes.signal_name
            for e in events
            if e.event_type == SIGNALED
        )
        size = sum(e.ByteSize() for e in events)
        runs.append(RunCost(run_id, by_name.total(), len(events), size, dict(by_name)))
        last = events[-1] if events else None
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last is not None and last.event_type == CONTINUED_AS_NEW else "")  # fmt: skip
    return runs


def signals_by_name(runs: list[RunCost]) -> dict[str, int]:
    """The Signals of every run, by signal name (`deliver` batches, the turns' notices)."""
    total: collections.Counter[str] = collections.Counter()
    for r in runs:
        total.update(r.by_name)
    return dict(total.most_common())


async def report(
    client: Client, entity_id: str, messages: int, elapsed: float, targets: Targets
) -> None:
    runs = await entity_runs(client, entity_id)
    rate = messages / elapsed
    print(f"\nEG7 burst of {messages} inputs to one conversation, drained in {elapsed:.1f} s "
          f"({rate:.0f} inputs/s), {len(runs)} entity runs")  # fmt: skip
    # SPEC §8 step 3: at most 4 Signal-With-Start per entity per second, batches of at most 16.
    ceiling = PER_ENTITY_PER_SECOND * names.BATCH_MAX_ITEMS
    print(f"delivery ceiling of one conversation (SPEC §8: {PER_ENTITY_PER_SECOND} Signals/s "
          f"x {names.BATCH_MAX_ITEMS} inputs): {ceiling} inputs/s; drained at "
          f"{rate / ceiling:.0%} of it (issue 12's 150 inputs/s is above it)")  # fmt: skip
    print(f"{'run':>4} {'signals':>8} {'events':>7} {'history MB':>11}")
    for i, r in enumerate(runs, start=1):
        print(f"{i:>4} {r.signals:>8} {r.events:>7} {r.bytes / 1e6:>11.2f}")
    signals = sum(r.signals for r in runs)
    worst_bytes = max(r.bytes for r in runs)
    print(f"Signals by name: {signals_by_name(runs)}")
    signals_ok = targets.check("Signals in the entity's run", signals < SIGNALS_MAX)
    bytes_ok = targets.check("history per run", worst_bytes < HISTORY_MAX_BYTES)
    print(f"\nall runs: {signals} Signals for {messages} inputs, "
          f"{messages / max(signals, 1):.1f} inputs per Signal "
          f"(target < {SIGNALS_MAX}: {signals_ok}); worst run: {worst_bytes / 1e6:.2f} MB "
          f"history (target < {HISTORY_MAX_BYTES / 1e6:.0f} MB: {bytes_ok})")  # fmt: skip


def main() -> int:
    exit_on_signals()  # SIGTERM unwinds too, so the servers this started are stopped
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    add_no_fail(parser)
    args = parse_with_quick(parser, {"messages": 50})
    targets = Targets()
    run_in_temp_folder("eventos-burst-", lambda folder: run(args.messages, folder, targets))
    return targets.exit_code(args)


if __name__ == "__main__":
    raise SystemExit(main())
