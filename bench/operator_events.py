"""The operator event stream (docs/events.md): what its trigger costs the router's and the
relay's statements, how fast the sequencer places events, and what a stream's read costs.

    .venv/bin/python bench/operator_events.py [--inputs 20000] [--events 100000] [--quick]

Starts an embedded PostgreSQL (or a fresh database on EVENTOS_DATABASE_URL's server), then:

1. writes: `--inputs` inputs of one employee routed by the real router code (route_pass, two
   timeline entries per input), marked delivered 16 at a time (the relay's statement shape)
   and dead-lettered 16 at a time (an `input.dead` entry each, which the trigger turns into an
   event), with the timeline's triggers on and the operator events' trigger on or off
   (ALTER TABLE employee_timeline … TRIGGER employee_timeline_operator_events), alternating,
   on the same database. Prints inputs/s of each step.
2. places: `--events` events written without a place, then placed by the sequencer
   (eventos.owner.event_positions.place, 1,000 per transaction). Prints events placed/s.
3. reads: 200 reads of each shape through eventos.operator.events.read from a place 1,000
   events back: the admin's, a user's (who matches one event in 50), one employee's. Prints
   p50/p99 in ms and the events each read returned.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from harness import fresh_database, parse_with_quick, progress, run_in_temp_folder, table
from timeline import record, spec

from eventos.bus.inbox import append
from eventos.db import Conn, connect
from eventos.db.migrate import migrate
from eventos.delivery.routing import route_pass
from eventos.employees import lifecycle
from eventos.llm.endpoints import LlmEndpoints
from eventos.operator import events
from eventos.owner import event_positions
from eventos.secret_purposes import SecretPurposes
from eventos.settings import DatabaseSettings
from eventos.spec.model import load_specs

READS = 200
TRIGGER = "employee_timeline_operator_events"


async def writes(conn: Conn, employee: str, inputs: int, on: bool) -> list[float]:
    """Inputs/s of routing, marking delivered and dead-lettering `inputs` inputs."""
    verb = "ENABLE" if on else "DISABLE"
    await conn.execute(f"ALTER TABLE employee_timeline {verb} TRIGGER {TRIGGER}".encode())
    for start in range(0, inputs, 1000):
        await append(conn, [record(employee, n) for n in range(start, min(inputs, start + 1000))])
    rates = []
    t = time.perf_counter()
    while (await route_pass(conn)).rows:
        pass
    rates.append(inputs / (time.perf_counter() - t))
    cur = await conn.execute("SELECT id FROM bus_deliveries WHERE stream_key LIKE %s ORDER BY id",
                             (f"{employee}/%",))  # fmt: skip
    ids = [int(r["id"]) for r in await cur.fetchall()]
    for status, reason in (("delivered", None), ("dead", "turn_failed")):
        t = time.perf_counter()
        for k in range(0, len(ids), 16):
            await conn.execute("UPDATE bus_deliveries SET status = %s, reason = %s, "
                               "updated_at = now() WHERE id = ANY(%s)",
                               (status, reason, ids[k : k + 16]))  # fmt: skip
        rates.append(len(ids) / (time.perf_counter() - t))
    return rates


async def write_costs(conn: Conn, inputs: int) -> None:
    names = [f"w{i}" for i in range(4)]
    for name in names:
        (s,) = load_specs(spec(name))
        await lifecycle.apply(conn, s, LlmEndpoints(), SecretPurposes())
        await lifecycle.start(conn, name)
        await lifecycle.activate(conn, name)
    results: dict[bool, list[list[float]]] = {True: [], False: []}
    for i, name in enumerate(names):  # on, off, on, off
        on = i % 2 == 0
        progress(
            f"writes of {inputs:,} inputs, the operator events' trigger {'on' if on else 'off'}"
        )
        results[on].append(await writes(conn, name, inputs, on))
    rows: list[list[Any]] = []
    for step, k in (("route", 0), ("mark delivered", 1), ("dead-letter (an event each)", 2)):
        with_t = statistics.mean(r[k] for r in results[True])
        without = statistics.mean(r[k] for r in results[False])
        per_input_us = (1 / with_t - 1 / without) * 1e6
        rows.append([step, f"{without:,.0f}", f"{with_t:,.0f}", f"{per_input_us:+.1f}"])
    print(table(["inputs/s", "no event trigger", "event trigger", "µs per input"], rows))


async def places(conn: Conn, n: int) -> None:
    progress(f"writing {n:,} events without a place")
    await conn.execute("INSERT INTO operator_events (employee, audience, kind, ref, state) "
                       "SELECT 'e' || (g %% 10), CASE WHEN g %% 50 = 0 THEN 'ann' END, "
                       "'turn.done', g::text, 'done' FROM generate_series(1, %s) g",
                       (n,))  # fmt: skip
    t = time.perf_counter()
    placed = await event_positions.place(conn)
    seconds = time.perf_counter() - t
    rate = placed.operator / seconds
    print(table(["events placed", "seconds", "events placed/s"],
                [[f"{placed.operator:,}", f"{seconds:.2f}", f"{rate:,.0f}"]]))  # fmt: skip


async def reads(conn: Conn) -> None:
    last, _ = await events.top(conn)
    start = max(0, last - 1000)
    shapes = {
        "admin": events.Reader("owner", admin=True),
        "a user (1 in 50)": events.Reader("ann", admin=False),
        "one employee": events.Reader("owner", admin=True, employee="e3"),
    }
    out = []
    for shape, reader in shapes.items():
        times, found = [], 0
        for _ in range(READS):
            t = time.perf_counter()
            read = await events.read(conn, reader, start)
            times.append((time.perf_counter() - t) * 1000)
            found = len(read.events)
        q = statistics.quantiles(times, n=100)
        out.append([shape, found, f"{q[49]:.2f}", f"{q[98]:.2f}"])
    print(table(["read (1,000 places back)", "events", "read p50 ms", "p99 ms"], out))


async def run(args: argparse.Namespace, folder: Path) -> None:
    with fresh_database(folder, "eventos_operator_events") as url:
        async with await connect(DatabaseSettings(url=url), autocommit=True) as conn:
            await migrate(conn)
            await write_costs(conn, args.inputs)
            await places(conn, args.events)
            await reads(conn)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=100_000)
    args = parse_with_quick(parser, {"inputs": 500, "events": 2000})
    return run_in_temp_folder("eventos-bench-operator-events-", lambda f: run(args, f))


if __name__ == "__main__":
    raise SystemExit(main())
