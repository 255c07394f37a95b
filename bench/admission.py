"""Admission's cost against the number of waiting conversations (issue 27 point 1).

    .venv/bin/python bench/admission.py [--waiters 4000] [--asks 200] [--handoffs 100]
                                        [--quick] [--no-fail]

On an embedded PostgreSQL (or a fresh database on EVENTOS_DATABASE_URL's server), ten employees
and a full instance (capacity 8, every slot held by a running turn), with queues of `--waiters`,
a quarter and a 40th of it waiting conversations (spread over the employees and classes C2 to
C4). Measured through `eventos.scheduling.admission` as the workflow worker calls it, one ask
at a time:

- a queued ask: a waiting entity asks again while every slot is taken (what most asks of a
  backlog are); milliseconds per ask and this process's CPU per ask;
- a handoff: a turn ends (`release` offers its slot to the next waiter) and the woken entity
  asks and is granted the slot; milliseconds and CPU per handoff.

Target: the cost does not grow with the queue: at the longest queue each figure's CPU is at most
twice the shortest queue's. The driver exits 3 when it does not (`--no-fail`: 0; a `--quick`
smoke run exits 0 whatever its figures say).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness import (
    Targets,
    add_no_fail,
    fresh_database,
    parse_with_quick,
    progress,
    run_in_temp_folder,
    table,
)
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.contracts import AdmitRequest
from eventos.db import Conn, connect, open_pool
from eventos.db.migrate import migrate
from eventos.employees import lifecycle
from eventos.llm.endpoints import LlmEndpoints
from eventos.scheduling import admission
from eventos.scheduling.policy import SchedConfig
from eventos.secret_purposes import SecretPurposes
from eventos.settings import DatabaseSettings
from eventos.spec.model import load_specs

EMPLOYEES = [f"adm-{i}" for i in range(10)]
CAPACITY = 8
TARGET_GROWTH = 2.0  # CPU per operation at the longest queue over the shortest's
SPEC = """apiVersion: eventos/v1
kind: Employee
metadata: {name: NAME}
spec:
  agents:
    - name: front
      model: {provider: local, name: echo}
  triggers:
    - {kind: chat}
"""
WAITERS = """
INSERT INTO sched_waiters (stream_key, employee, generation, agent, thread, class, workflow_id,
    requested_at)
SELECT 'q' || i || '-' || %(n)s, (%(employees)s::text[])[1 + i %% 10], 1, 'front',
       'q' || i || '-' || %(n)s, 2 + i %% 3, 'wf-q' || i || '-' || %(n)s,
       now() - interval '1 hour' + i * interval '1 ms'
FROM generate_series(0, %(n)s - 1) AS i
"""
STREAMS = """
INSERT INTO bus_streams (stream_key, employee, generation, lane, thread, entity_id)
SELECT stream_key, employee, 1, 'worker', thread, workflow_id FROM sched_waiters
ON CONFLICT DO NOTHING
"""
STREAM = """
INSERT INTO bus_streams (stream_key, employee, generation, lane, thread, entity_id)
VALUES (%s, %s, 1, 'worker', %s, %s) ON CONFLICT DO NOTHING
"""


def request(key: str, employee: str, klass: int, n: int) -> AdmitRequest:
    return AdmitRequest(employee, 1, "front", key, key, klass, workflow_id=f"wf-{key}",
                        ask=f"bench:{key}:{n}")  # fmt: skip


class Clock:
    """Wall and this process's CPU time over a block, per operation."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.ops = 0

    def add(self, wall: float, cpu: float) -> None:
        self.wall, self.cpu, self.ops = self.wall + wall, self.cpu + cpu, self.ops + 1

    def per_op_ms(self) -> tuple[float, float]:
        return self.wall / self.ops * 1000, self.cpu / self.ops * 1000


async def one_queue(pool: AsyncConnectionPool[Conn], waiters: int, args: argparse.Namespace
                    ) -> tuple[Clock, Clock]:  # fmt: skip
    cfg = SchedConfig(capacity=CAPACITY, class_max={k: CAPACITY for k in names.CLASSES})
    async with pool.connection() as conn:
        for table_name in ("sched_waiters", "sched_leases", "sched_rounds"):
            await conn.execute(f"DELETE FROM {table_name}".encode())
        await conn.execute("UPDATE turns SET status = 'done' WHERE status = 'running'")
        running = []
        for i in range(CAPACITY):  # every slot held
            key = f"run{i}-{waiters}"
            req = request(key, EMPLOYEES[i % len(EMPLOYEES)], names.C2_CUSTOMER, 0)
            await conn.execute(STREAM, (key, req.employee, key, req.workflow_id))
            answer = await admission.acquire(conn, req, cfg)
            assert answer.admission.granted, answer
            running.append(answer.admission.turn_id)
        await conn.execute(WAITERS, {"n": waiters, "employees": EMPLOYEES})
        await conn.execute(STREAMS)
        rows = await (await conn.execute(
            "SELECT stream_key, employee, class FROM sched_waiters ORDER BY requested_at"
        )).fetchall()  # fmt: skip
    asks, handoffs = Clock(), Clock()
    async with pool.connection() as conn:
        for n in range(args.asks):  # the newest waiters ask again: every slot is taken
            r = rows[-1 - n % len(rows)]
            req = request(r["stream_key"], r["employee"], int(r["class"]), n)
            wall, cpu = time.perf_counter(), time.process_time()
            answer = await admission.acquire(conn, req, cfg)
            asks.add(time.perf_counter() - wall, time.process_time() - cpu)
            assert not answer.admission.granted, answer
        by_workflow = {f"wf-{r['stream_key']}": r for r in rows}
        for n in range(min(args.handoffs, waiters // 2)):  # each to a waiter of its own
            wall, cpu = time.perf_counter(), time.process_time()
            _, wake = await admission.release(conn, cfg, running.pop(0), names.TURN_DONE)
            (woken,) = wake
            r = by_workflow[woken]
            req = request(r["stream_key"], r["employee"], int(r["class"]), n)
            answer = await admission.acquire(conn, req, cfg)
            handoffs.add(time.perf_counter() - wall, time.process_time() - cpu)
            assert answer.admission.granted, answer
            running.append(answer.admission.turn_id)
    return asks, handoffs


async def run(folder: Path, args: argparse.Namespace, targets: Targets) -> None:
    with fresh_database(folder, "eventos_admission") as url:
        db = DatabaseSettings(url=url, pool_max=4)
        async with await connect(db) as conn:
            await migrate(conn)
            for spec_doc in load_specs("---\n".join(SPEC.replace("NAME", e) for e in EMPLOYEES)):
                await lifecycle.apply(conn, spec_doc, LlmEndpoints(), SecretPurposes())
                await lifecycle.start(conn, spec_doc.name)
                await lifecycle.activate(conn, spec_doc.name)
        pool = await open_pool(db)
        try:
            results = {}
            for n in args.waiters:
                progress(f"{n} waiters: {args.asks} queued asks, {args.handoffs} handoffs")
                results[n] = await one_queue(pool, n, args)
        finally:
            await pool.close()
    rows = []
    for n, (asks, handoffs) in results.items():
        rows.append([str(n), *(f"{x:.2f}" for x in asks.per_op_ms()),
                     *(f"{x:.2f}" for x in handoffs.per_op_ms())])  # fmt: skip
    print(f"\nadmission, capacity {CAPACITY} all held, {len(EMPLOYEES)} employees "
          f"(ms per operation; cpu: this process)")  # fmt: skip
    print(table(["waiters", "queued ask ms", "ask cpu ms", "handoff ms", "handoff cpu ms"], rows))
    first, last = results[args.waiters[0]], results[args.waiters[-1]]
    for what, i in (("queued ask", 0), ("handoff", 1)):
        growth = last[i].per_op_ms()[1] / max(first[i].per_op_ms()[1], 1e-6)
        verdict = targets.check(f"{what} cpu growth", growth <= TARGET_GROWTH)
        print(f"{what}: cpu at {args.waiters[-1]} waiters is {growth:.2f}x that at "
              f"{args.waiters[0]}; target ≤ {TARGET_GROWTH:.0f}x: {verdict}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiters", type=int, default=4000,
                        help="the longest queue (and a quarter and a 40th of it)")  # fmt: skip
    parser.add_argument("--asks", type=int, default=200, help="queued asks per queue length")
    parser.add_argument("--handoffs", type=int, default=100, help="handoffs per queue length")
    add_no_fail(parser)
    args = parse_with_quick(parser, {"waiters": 400, "asks": 10, "handoffs": 5})
    args.waiters = [max(1, args.waiters // 40), args.waiters // 4, args.waiters]
    targets = Targets()
    run_in_temp_folder("eventos-admission-bench-", lambda folder: run(folder, args, targets))
    return targets.exit_code(args)


if __name__ == "__main__":
    raise SystemExit(main())
