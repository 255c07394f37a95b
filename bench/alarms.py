"""Alarms at the cap: 500 alarms per employee over 20 employees, all due within one minute.

    .venv/bin/python bench/alarms.py [--employees 20] [--alarms 500] [--window-s 60] [--quick]

Starts an embedded PostgreSQL and the Temporal dev server (tier S flags), or takes a fresh
database on EVENTOS_DATABASE_URL's server and TEMPORAL_ADDRESS, and the workflow worker
in this process, applies and starts the employees (local provider, the alarm tools) and their
supervisors. Then each employee sets its alarms through the `set_alarm` tool (the real handler
and runner, one transaction per call) followed by the `alarms_changed` Signal the tool activity
sends, at due times spread evenly over a window that opens once setting is expected to end.
It waits until every alarm fired and prints the fire lateness (fired_at - due_at, p50/p99/max),
and per employee the supervisor's Signals and history (runs, events, bytes). The fired inputs
are not routed (no router runs): this measures the timer and `fire_due` only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from harness import (
    exit_on_signals,
    fresh_database,
    parse_with_quick,
    progress,
    run_in_temp_folder,
    table,
    temporal_server,
)

from eventos import names
from eventos.alarms.activity import signal_changed
from eventos.contracts import SupervisorStatus, ToolCallInput
from eventos.control.intent_deliverer import ensure_supervisor
from eventos.db import Conn, connect, open_pool
from eventos.db.migrate import migrate
from eventos.employees import lifecycle
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.keys import OutboxKeys, new_key_entry
from eventos.runtime.payload_guard import connect as temporal_connect
from eventos.secret_purposes import SecretPurposes
from eventos.settings import AlarmSettings, DatabaseSettings, SecretStore, TemporalSettings
from eventos.spec.model import load_specs
from eventos.tools import alarms as alarm_tools
from eventos.tools.runner import ToolRunner
from eventos.workers.activities import DbActivities
from eventos.workers.roles import workflow_worker

SIGNALED = 26  # EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
SET_ESTIMATE_S = 0.015  # seconds per set_alarm call and its Signal (2 shared cores)
LEAD_S = 10.0  # the window opens this long after setting is expected to end
POLL_S = 0.5
PROGRESS_EVERY_S = 5.0


def spec(name: str) -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}, tools: [set_alarm]}}]
  triggers: [{{kind: chat}}]
"""


def call(employee: str, n: int, at: datetime) -> ToolCallInput:
    args = json.dumps({"text": f"alarm {n}", "at": at.isoformat()})
    turn = f"turn-conv-{employee}-g1-talk-main-1"
    return ToolCallInput(employee, 1, "front", "main", "talk", f"{employee}/g1/talk/main", turn,
                         f"call_{n}", "set_alarm", args, 1, {"kind": "chat"}, uuid.uuid4().hex,
                         0)  # fmt: skip


async def set_alarms(
    runner: ToolRunner, client: object, employee: str, dues: list[datetime]
) -> None:
    from temporalio.client import Client

    assert isinstance(client, Client)
    for n, at in enumerate(dues):
        result = await runner.run(call(employee, n, at))
        if result.outcome != names.TOOL_OK:
            raise RuntimeError(f"set_alarm refused: {result.content}")
        await signal_changed(client, employee, 1)  # what the tool activity does after commit


async def armed(client: object, employee: str) -> None:
    """The supervisor's first run read the alarms (its `alarms` deadline is set)."""
    from temporalio.client import Client

    assert isinstance(client, Client)
    handle = client.get_workflow_handle(names.supervisor_id(employee, 1))
    for _ in range(300):
        status = await handle.query(names.QUERY_STATUS, result_type=SupervisorStatus)
        if "alarms" in status.deadlines:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the supervisor of {employee} did not arm its alarms deadline")


async def scalar(conn: Conn, query: str) -> int:
    cur = await conn.execute(query)  # type: ignore[arg-type]
    row = await cur.fetchone() or {}
    return int(next(iter(row.values()), 0))


async def run(n_employees: int, n_alarms: int, window_s: float, lead_s: float,
              folder: Path) -> None:  # fmt: skip
    with fresh_database(folder, "eventos_alarms") as url, temporal_server(folder) as temporal:
        db = DatabaseSettings(url=url, pool_max=30)
        names_ = [f"alarm{i:02d}" for i in range(n_employees)]
        async with await connect(db) as conn:
            await migrate(conn)
            for name in names_:
                (s,) = load_specs(spec(name))
                await lifecycle.apply(conn, s, LlmEndpoints(), SecretPurposes())
                await lifecycle.start(conn, name)
        await measure(db, temporal, names_, n_alarms, window_s, lead_s)


async def measure(db: DatabaseSettings, temporal: TemporalSettings, employees_: list[str],
                  n_alarms: int, window_s: float, lead_s: float) -> None:  # fmt: skip
    pool = await open_pool(db)
    client = await temporal_connect(temporal.address, temporal.namespace)
    acts = DbActivities(pool, outbox=OutboxKeys.parse(new_key_entry("bench")))
    queue = names.WORKFLOW_QUEUE
    runner = ToolRunner(pool, SecretStore(env={}),
                        {alarm_tools.SETTINGS_KEY: AlarmSettings()})  # fmt: skip
    async with workflow_worker(client, queue, acts):
        async with pool.connection() as conn:
            for e in employees_:
                async with conn.transaction():
                    await ensure_supervisor(conn, client, e, 1, queue)
        for e in employees_:  # each supervisor's first run activated its generation
            await armed(client, e)
        progress(f"{len(employees_)} supervisors running")
        lead = lead_s + SET_ESTIMATE_S * n_alarms * len(employees_)  # once all are set
        opens = datetime.now(UTC) + timedelta(seconds=lead)
        dues = [opens + timedelta(seconds=window_s * i / n_alarms) for i in range(n_alarms)]
        t0 = time.perf_counter()
        await asyncio.gather(*(set_alarms(runner, client, e, dues) for e in employees_))
        set_s = time.perf_counter() - t0
        total = n_alarms * len(employees_)
        early = (opens - datetime.now(UTC)).total_seconds()
        progress(f"{total} alarms set in {set_s:.1f} s; the window opens in {early:.1f} s")
        async with pool.connection() as conn:
            shown = 0.0
            while (fired := await scalar(conn, "SELECT count(*) FROM alarms "
                                               "WHERE status = 'fired'")) < total:  # fmt: skip
                if time.monotonic() - shown >= PROGRESS_EVERY_S:
                    progress(f"{fired} of {total} fired")
                    shown = time.monotonic()
                await asyncio.sleep(POLL_S)
            cur = await conn.execute(
                "SELECT extract(epoch FROM fired_at - due_at)::float8 AS late FROM alarms"
            )
            late = sorted(float(r["late"]) for r in await cur.fetchall())
        await report(client, employees_, late, set_s, window_s)
    await pool.close()


def pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def report(client: object, employees_: list[str], late: list[float], set_s: float,
                 window_s: float) -> None:  # fmt: skip
    from temporalio.client import Client

    assert isinstance(client, Client)
    per = len(late) // len(employees_)
    print(f"\n{len(late)} alarms ({per} per employee, {len(employees_)} employees) due within "
          f"{window_s:.0f} s; set in {set_s:.1f} s")  # fmt: skip
    print(f"fire lateness: p50 {pct(late, 50):.2f} s, p99 {pct(late, 99):.2f} s, "
          f"max {late[-1]:.2f} s, mean {statistics.fmean(late):.2f} s")  # fmt: skip
    rows = []
    for e in employees_:
        sid = names.supervisor_id(e, 1)
        runs = [w async for w in client.list_workflows(f"WorkflowId = '{sid}'")]
        signals = events = size = 0
        for w in runs:
            handle = client.get_workflow_handle(sid, run_id=w.run_id)
            history = [ev async for ev in handle.fetch_history_events()]
            signals += sum(1 for ev in history if ev.event_type == SIGNALED)
            events += len(history)
            size += sum(ev.ByteSize() for ev in history)
        rows.append((e, len(runs), signals, events, f"{size / 1e6:.2f}"))
    print(table(("supervisor", "runs", "signals", "history events", "history MB"), rows))


def main() -> int:
    exit_on_signals()  # SIGTERM unwinds too, so the servers this started are stopped
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--employees", type=int, default=20)
    parser.add_argument("--alarms", type=int, default=500)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument(
        "--lead-s",
        type=float,
        default=LEAD_S,
        help="seconds from setting's expected end to the window",
    )
    tiny = {"employees": 2, "alarms": 5, "window_s": 2.0, "lead_s": 1.0}
    args = parse_with_quick(parser, tiny)
    return run_in_temp_folder(
        "eventos-alarms-",
        lambda folder: run(args.employees, args.alarms, args.window_s, args.lead_s, folder),
    )


if __name__ == "__main__":
    raise SystemExit(main())
