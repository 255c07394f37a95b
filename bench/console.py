"""The web console's pages on a large instance: what each page's API calls cost the server.

    .venv/bin/python bench/console.py [--employees 100] [--rows 100000] [--repeat 200] [--quick]

Starts an embedded PostgreSQL (or takes a fresh database on EVENTOS_DATABASE_URL's server) and
the real ingress service, and fills the database: `--employees` running employees, each with a
budget and today's spend, 3 owner messages routed and waiting (class C1) and 2 open attention
items; the first employee also has `--rows` timeline entries (the mix real traffic writes, over
a week) and `--rows` finished turns (each with a model call) over 1,000 conversations. Then it
loads each console page as the browser does, `--repeat` times over loopback with the admin
token: the employees page (`/v1/me`, `/v1/employee-summaries`) and the first employee's page
(the employee, why waiting, conversations, turns, timeline), and prints per API call the server
time (request to last byte, p50 and p99) and the bytes sent, then the console's own payload:
the page, its files gzipped, and its largest JavaScript file.
No Temporal: nothing here runs a turn.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from pathlib import Path

import httpx
from harness import (
    ADMIN_TOKEN,
    Stack,
    exit_on_signals,
    fresh_database,
    parse_with_quick,
    progress,
    run_in_temp_folder,
    start_ingress,
    table,
)

from eventos.console.assets import Assets
from eventos.db import Conn, connect
from eventos.db.migrate import migrate
from eventos.delivery.routing import route_pass
from eventos.employees import lifecycle
from eventos.llm.endpoints import LlmEndpoints
from eventos.owner import chat
from eventos.secret_purposes import SecretPurposes
from eventos.settings import DatabaseSettings
from eventos.spec.model import load_specs
from eventos.testing.timeline import bulk_timeline

MESSAGES_EACH = 3
ATTENTION_EACH = 2
CONVERSATIONS = 1000
WARMUP = 5


def spec(name: str) -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  budget: {{daily_usd: 20}}
  agents: [{{name: front, model: {{provider: local, name: scripted}}}}]
  triggers:
    - {{kind: chat}}
"""


async def statements(conn: Conn, script: str, params: dict[str, object]) -> None:
    """Each `;`-separated statement of `script` with `params`, then a commit."""
    for statement in script.split(";"):
        await conn.execute(statement.encode(), params)
    await conn.commit()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def seed_employees(conn: Conn, names: list[str]) -> None:
    """Applied, started and running; today's budget and spend; messages waiting; attention."""
    for name in names:
        (s,) = load_specs(spec(name))
        await lifecycle.apply(conn, s, LlmEndpoints(), SecretPurposes())
        await lifecycle.start(conn, name)
        await lifecycle.activate(conn, name)
        for i in range(MESSAGES_EACH):
            await chat.send(conn, name, uuid.uuid4().hex, f"message {i}")
    await statements(conn, """
        INSERT INTO employee_budgets (employee, daily_usd, timezone, offset_s, period_start,
                                      period_end, state)
        SELECT name, 20, 'UTC', 0, date_trunc('day', now()), date_trunc('day', now()) + '1 day',
               'normal' FROM employees;
        INSERT INTO employee_spend (employee, period_start, spent_usd, reserved_usd)
        SELECT name, date_trunc('day', now()), random() * 15, 0.02 FROM employees;
        INSERT INTO attention_items (employee, kind, severity, ref, detail)
        SELECT name, 'bench_item', 'warning', name || '#' || i, 'made by bench/console.py'
        FROM employees, generate_series(1, %(each)s) i
    """, {"each": ATTENTION_EACH})  # fmt: skip
    while (await route_pass(conn)).routed:
        pass
    await conn.commit()


async def seed_turns(conn: Conn, name: str, rows: int) -> None:
    """`rows` finished turns of `name` over 1,000 conversations, each with one model call."""
    params = {"employee": name, "rows": rows, "conversations": CONVERSATIONS}
    await statements(conn, """
        INSERT INTO bus_streams (stream_key, employee, generation, lane, thread, entity_id)
        SELECT %(employee)s || '/g1/customer/t' || i, %(employee)s, 1, 'customer', 't' || i,
               'bench-' || i
        FROM generate_series(1, %(conversations)s) i;
        INSERT INTO conversations (employee, generation, agent, thread, stream_key, next_turn)
        SELECT %(employee)s, 1, 'front', 't' || i, %(employee)s || '/g1/customer/t' || i,
               %(rows)s / %(conversations)s + 1
        FROM generate_series(1, %(conversations)s) i;
        INSERT INTO turns (id, employee, generation, agent, thread, n, class, stream_key, status,
                           started_at, ended_at)
        SELECT 'bench-turn-' || g, %(employee)s, 1, 'front', 't' || (g %% %(conversations)s + 1),
               g, 2, %(employee)s || '/g1/customer/t' || (g %% %(conversations)s + 1), 'done',
               now() - make_interval(secs => g * 10), now() - make_interval(secs => g * 10 - 2)
        FROM generate_series(1, %(rows)s) g;
        INSERT INTO spend_events (key, employee, period_start, turn_id, class, model,
                                  estimate_usd, actual_usd, input_tokens, output_tokens, state)
        SELECT 'bench-' || g, %(employee)s, date_trunc('day', now()), 'bench-turn-' || g, 2,
               'local/scripted', 0.01, 0.004, 800, 120, 'settled'
        FROM generate_series(1, %(rows)s) g
    """, params)  # fmt: skip
    await conn.execute("ANALYZE")
    await conn.commit()


def pages(first: str) -> dict[str, list[str]]:
    """The API calls each console page makes when it opens (app start calls /v1/me)."""
    e = f"/v1/employees/{first}"
    return {
        "employees": ["/v1/me", "/v1/employee-summaries"],
        "employee": [e, f"{e}/waiting", f"{e}/conversations", f"{e}/turns?limit=20",
                     f"{e}/timeline"],
    }  # fmt: skip


def measure(base: str, calls: dict[str, list[str]], repeat: int) -> list[list[object]]:
    """Each call `repeat` times after a warm-up: p50 and p99 ms, and bytes sent."""
    rows: list[list[object]] = []
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Accept-Encoding": "gzip"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        for page, paths in calls.items():
            total50 = total99 = 0.0
            sent = 0
            for path in paths:
                first = client.get(path)
                if first.status_code == 404 and "nothing is served" in first.text:
                    rows.append([page, f"GET {path}", "not served here", "", ""])
                    continue
                if first.status_code != 200:
                    raise RuntimeError(f"GET {path}: {first.status_code} {first.text[:300]}")
                for _ in range(WARMUP):
                    client.get(path)
                times = []
                for _ in range(repeat):
                    started = time.perf_counter()
                    r = client.get(path)
                    times.append((time.perf_counter() - started) * 1000)
                    size = len(r.content)
                p50, p99 = statistics.median(times), percentile(times, 0.99)
                total50, total99, sent = total50 + p50, total99 + p99, sent + size
                rows.append([page, f"GET {path}", f"{p50:.1f}", f"{p99:.1f}", size])
            rows.append([page, "page (the calls one after another)", f"{total50:.1f}",
                         f"{total99:.1f}", sent])  # fmt: skip
    return rows


def payload(base: str) -> str:
    """The console's own bytes: the page and its files as a browser fetches them (gzip)."""
    assets = Assets.load()
    with httpx.Client(base_url=base, headers={"Accept-Encoding": "gzip"}, timeout=30) as client:
        page = client.get("/console")
        page.raise_for_status()
        raw_page = len(page.content)
    gzipped = sum(len(a.gzipped) for a in assets.files.values())
    name, largest = assets.largest_script()
    kb = len(assets.files[name].gzipped) / 1024
    return (
        f"console payload: the page {raw_page / 1024:.1f} KB ({len(assets.index.gzipped)} B "
        f"gzipped), {len(assets.files)} files {gzipped / 1024:.1f} KB gzipped; "
        f"largest JavaScript payload: {name} {largest / 1024:.1f} KB ({kb:.1f} KB gzipped)"
    )


async def run(n_employees: int, rows: int, repeat: int, folder: Path) -> None:
    names = [f"e{i:03d}" for i in range(n_employees)]
    with fresh_database(folder, "eventos_console") as url, Stack() as stack:
        async with await connect(DatabaseSettings(url=url)) as conn:
            await migrate(conn)
            progress(f"seeding {n_employees} employees")
            await seed_employees(conn, names)
            progress(f"seeding {rows} timeline entries and {rows} turns of {names[0]}")
            await bulk_timeline(conn, names[0], rows)
            await seed_turns(conn, names[0], rows)
        ingress = start_ingress(stack, url, router=None, env={})
        progress(f"measuring each call {repeat} times")
        measured = await asyncio.to_thread(measure, ingress.base_url, pages(names[0]), repeat)
        print(
            f"console pages, {n_employees} employees; {names[0]} has {rows} timeline entries and "
            f"{rows} turns over {CONVERSATIONS} conversations; each call {repeat} times, one at a "
            "time"
        )
        print(table(["page", "call", "p50 ms", "p99 ms", "bytes"], measured))
        print(payload(ingress.base_url))


def main() -> int:
    exit_on_signals()  # SIGTERM unwinds too, so the servers this started are stopped
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--employees", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parse_with_quick(parser, {"employees": 3, "rows": 1000, "repeat": 3})
    return run_in_temp_folder(
        "eventos-console-", lambda folder: run(args.employees, args.rows, args.repeat, folder)
    )


if __name__ == "__main__":
    raise SystemExit(main())
