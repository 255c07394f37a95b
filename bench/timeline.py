"""The timeline: a page's database time on a large timeline, and what its triggers cost the hot
paths that write it (router and relay; ingress's append writes no timeline row).

    .venv/bin/python bench/timeline.py [--rows 100000] [--employees 100] [--inputs 20000] [--quick]

Starts an embedded PostgreSQL (or a fresh database on EVENTOS_DATABASE_URL's server), then:

1. pages: `--rows` entries for one employee and 1,000 for each of the other `--employees - 1`
   (eventos.testing.timeline.bulk_timeline), then reads 200 pages of each shape through
   eventos.timeline.entries.page (the horizon's statement and the page's): the newest page, a
   page deep in the past by cursor, oldest first by cursor, one thread, one family of kinds, one
   chain. Prints p50/p99 per shape in ms and the plan of the newest page (EXPLAIN ANALYZE).
2. writes: `--inputs` inputs of one employee routed by the real router code (route_pass), then
   marked delivered 16 at a time and consumed 16 at a time (the relay's and the consuming
   save's statement shapes), once with the timeline's triggers and once without (ALTER TABLE
   … DISABLE TRIGGER), alternating, on the same database. Prints inputs/s of each step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from harness import (
    fresh_database,
    local_employee,
    parse_with_quick,
    progress,
    run_in_temp_folder,
    table,
)

from eventos.bus.inbox import IngressRecord, append
from eventos.db import Conn, connect
from eventos.db.migrate import migrate
from eventos.db.sql import Q
from eventos.delivery.routing import route_pass
from eventos.employees import lifecycle
from eventos.llm.endpoints import LlmEndpoints
from eventos.secret_purposes import SecretPurposes
from eventos.settings import DatabaseSettings
from eventos.spec.model import load_specs
from eventos.testing.timeline import bulk_timeline
from eventos.timeline import entries

READS = 200
TABLES = ("bus_deliveries", "turns", "outbound_messages")


def spec(name: str) -> str:
    return local_employee(name, f"[{{kind: grpc, driver: drv-{name}, thread_by: subject}}]")


async def pages(conn: Conn, rows: int, n_employees: int) -> None:
    progress(f"loading {rows:,} entries for e000 and 1,000 for {n_employees - 1} others")
    started = time.monotonic()
    await bulk_timeline(conn, "e000", rows)
    for i in range(1, n_employees):
        await bulk_timeline(conn, f"e{i:03d}", 1000)
    await conn.execute("ANALYZE employee_timeline")
    progress(f"loaded in {time.monotonic() - started:.1f} s")
    deep = entries.Position(entries.NEWEST, datetime.now(UTC) - timedelta(days=4), 2**62)
    past = entries.Position(entries.OLDEST, datetime.now(UTC) - timedelta(days=6), 0)
    shapes: dict[str, tuple[entries.Filters, str, entries.Position | None]] = {
        "newest": (entries.Filters("e000"), entries.NEWEST, None),
        "deep (cursor)": (entries.Filters("e000"), entries.NEWEST, deep),
        "oldest (cursor)": (entries.Filters("e000"), entries.OLDEST, past),
        "thread": (entries.Filters("e000", thread="main"), entries.NEWEST, None),
        "kind=turn": (
            entries.Filters("e000", kinds=("turn.started", "turn.done")),
            entries.NEWEST,
            None,
        ),
        "chain": (entries.Filters("e000", chain="bulk-e000-4242"), entries.NEWEST, None),
    }
    out = []
    for shape, (f, order, cursor) in shapes.items():
        times = []
        for _ in range(READS):
            t = time.perf_counter()
            page = await entries.page(conn, f, order, cursor, 50)
            times.append((time.perf_counter() - t) * 1000)
        q = statistics.quantiles(times, n=100)
        out.append([shape, len(page.entries), f"{q[49]:.2f}", f"{q[98]:.2f}"])
    print(table(["page (limit 50)", "rows", "p50 ms", "p99 ms"], out))
    edge = await entries.horizon(conn, "e000")
    params = {"employee": "e000", "thread": None, "chain": None, "limit": 51,
              "since": edge - timedelta(days=30), "until": edge, "before_at": None,
              "before_id": None}  # fmt: skip
    cur = await conn.execute(b"EXPLAIN (ANALYZE, BUFFERS) " + Q["timeline_newest"].encode(),
                             params, prepare=False)  # fmt: skip
    print("\n".join(r["QUERY PLAN"] for r in await cur.fetchall()))


def record(employee: str, n: int) -> IngressRecord:
    envelope = {"specversion": "1.0", "id": uuid.uuid4().hex, "source": "/bench", "type": "msg",
                "subject": f"s{n % 50}", "data": {"n": n}}  # fmt: skip
    return IngressRecord(source_key=f"grpc:drv-{employee}", dedupe_key=f"{n}", type="msg",
                         chain_id=envelope["id"], envelope=envelope,
                         size=len(json.dumps(envelope)))  # fmt: skip


async def writes(conn: Conn, employee: str, inputs: int, triggers: bool) -> list[float]:
    """Inputs/s of routing, marking delivered and consuming `inputs` inputs of `employee`."""
    verb = "ENABLE" if triggers else "DISABLE"
    for t in TABLES:
        await conn.execute(f"ALTER TABLE {t} {verb} TRIGGER USER".encode())
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
    for status in ("delivered", "done"):
        t = time.perf_counter()
        for k in range(0, len(ids), 16):
            await conn.execute("UPDATE bus_deliveries SET status = %s, updated_at = now() "
                               "WHERE id = ANY(%s)", (status, ids[k : k + 16]))  # fmt: skip
        rates.append(len(ids) / (time.perf_counter() - t))
    return rates


async def run(args: argparse.Namespace, folder: Path) -> None:
    with fresh_database(folder, "eventos_timeline") as url:
        async with await connect(DatabaseSettings(url=url), autocommit=True) as conn:
            await migrate(conn)
            await pages(conn, args.rows, args.employees)
            names = [f"w{i}" for i in range(4)]
            for name in names:
                (s,) = load_specs(spec(name))
                await lifecycle.apply(conn, s, LlmEndpoints(), SecretPurposes())
                await lifecycle.start(conn, name)
                await lifecycle.activate(conn, name)
            results: dict[bool, list[list[float]]] = {True: [], False: []}
            for i, name in enumerate(names):  # on, off, on, off
                on = i % 2 == 0
                progress(f"writes of {args.inputs:,} inputs, triggers {'on' if on else 'off'}")
                results[on].append(await writes(conn, name, args.inputs, on))
            rows: list[list[Any]] = []
            for step, k in (("route", 0), ("mark delivered", 1), ("consume", 2)):
                with_t = statistics.mean(r[k] for r in results[True])
                without = statistics.mean(r[k] for r in results[False])
                rows.append([step, f"{without:,.0f}", f"{with_t:,.0f}",
                             f"{(without / with_t - 1) * 100:+.0f}%"])  # fmt: skip
            print(table(["inputs/s", "no timeline", "timeline", "cost"], rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--employees", type=int, default=100)
    parser.add_argument("--inputs", type=int, default=20_000)
    args = parse_with_quick(parser, {"rows": 5000, "employees": 3, "inputs": 500})
    return run_in_temp_folder("eventos-bench-timeline-", lambda folder: run(args, folder))


if __name__ == "__main__":
    raise SystemExit(main())
