"""Storm guards under a delegation storm (SPEC §10, EG18): two employees delegating to each
other as fast as the model allows, on a simulated clock.

    .venv/bin/python bench/storm.py [--minutes 150] [--tick 2] [--kick-every 10] [--quick]

Starts an embedded PostgreSQL (or a fresh database on EVENTOS_DATABASE_URL's server) and runs
the real router (storm guards included), its messaging upkeep (digests) and the real tools; the
model is a script with no latency (the fastest a model can be), so every turn is one instant pass:
- every `--kick-every` simulated seconds A's owner chat starts a new chain: A delegates to B;
- B, woken by a task, completes it and delegates a task back to A at once;
- A, woken by a result, delegates to B again (deadline 300 s on every task, fired as the
  supervisors' alarm timers would, on the simulated clock: a task whose wake was digested times
  out instead of holding one of A's 200 open tasks for ever).
Nothing ever stops on its own: the guards must. Printed: hops and cycles cut, the breaker's
openings, digests, and the messages per minute that still cross the edge A → B (delivered one
by one, and as digests). The clock is simulated (the guards take `now` from the caller), so
`--minutes` of storm run in a few wall-clock minutes.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from harness import exit_on_signals, fresh_database, parse_with_quick, progress, run_in_temp_folder
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.alarms.store import fire_due
from eventos.contracts import DeliveryItem, ToolCallInput
from eventos.db import Conn, connect, open_pool
from eventos.db.migrate import migrate
from eventos.delivery.routing import route_pass
from eventos.employees import lifecycle
from eventos.llm.endpoints import LlmEndpoints
from eventos.messaging.storm import flush_due
from eventos.secret_purposes import SecretPurposes
from eventos.settings import DatabaseSettings, SecretStore
from eventos.spec.model import load_specs
from eventos.tools.runner import ToolRunner
from eventos.workflows.turn import causal, task_ids

A, B = "alpha", "beta"
T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
CHAT_ROUTE = {"kind": "chat", "trigger": "chat", "agent": "front", "thread": "main",
              "reply": True, "session": "owner", "audience": "owner"}  # fmt: skip
DEADLINE_S = 300


def spec(name: str) -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents:
    - name: front
      model: {{provider: local, name: scripted}}
      tools: [send_to_employee, delegate_to_employee, complete_task]
  triggers:
    - {{kind: chat}}
"""


class Storm:
    """The two employees' instant turns, the router and its upkeep on one simulated clock."""

    def __init__(self, pool: AsyncConnectionPool[Conn]) -> None:
        self.pool = pool
        self.tools = ToolRunner(pool, SecretStore(env={}))
        self.calls: Counter[str] = Counter()
        self.turns = 0
        self.timed_out = 0

    async def call(self, employee: str, stream: str, route: dict[str, Any], tool: str,
                   args: dict[str, Any], context: tuple[str, int, list[str]],
                   woken: list[str], now: datetime) -> None:  # fmt: skip
        chain, hop, path = context
        _, _, lane, thread = stream.split("/")
        call = ToolCallInput(employee, 1, "front", thread, lane, stream, f"turn-{uuid.uuid4().hex}",
                             "call_1", tool, json.dumps(args), names.C3_INTERNAL, route, chain,
                             hop, path, woken_tasks=woken)  # fmt: skip
        result = await self.tools.run(call, now=now)
        self.calls[f"{tool} {result.outcome}"] += 1

    async def kick(self, now: datetime) -> None:
        """A's owner asks for work: a new chain, hop 0."""
        chain = f"chain-{uuid.uuid4().hex[:12]}"
        await self.call(A, f"{A}/g1/talk/main", CHAT_ROUTE, "delegate_to_employee",
                        {"to": B, "task": "work", "deadline_s": DEADLINE_S}, (chain, 0, []), [],
                        now)  # fmt: skip

    async def turns_pass(self, now: datetime) -> None:
        """Every stream with pending inputs runs one instant turn over all of them."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, stream_key, seq, ingress_id, class, type, route, chain_id, hop, "
                "size, payload, body_ref, causation_id FROM bus_deliveries "
                "WHERE status = 'pending' ORDER BY stream_key, seq"
            )
            rows = await cur.fetchall()
            await conn.execute("UPDATE bus_deliveries SET status = 'done' WHERE id = ANY(%s)",
                               ([r["id"] for r in rows],))  # fmt: skip
            await conn.commit()
        streams: dict[str, list[DeliveryItem]] = {}
        for r in rows:
            streams.setdefault(str(r["stream_key"]), []).append(DeliveryItem.from_row(r))
        for stream, items in streams.items():
            await self.turn(stream, items, now)

    async def turn(self, stream: str, items: list[DeliveryItem], now: datetime) -> None:
        self.turns += 1
        employee, context, route = stream.split("/")[0], causal(items), dict(items[0].route)
        tasks = task_ids(items)
        if employee == B:
            for task in tasks:
                await self.call(B, stream, route, "complete_task", {"task_id": task,
                                "result": "done"}, context, tasks, now)  # fmt: skip
            if tasks:
                await self.call(B, stream, route, "delegate_to_employee",
                                {"to": A, "task": "your turn", "deadline_s": DEADLINE_S},
                                context, tasks, now)  # fmt: skip
        elif any(i.type in (names.TYPE_IPC_RESULT, names.TYPE_IPC_TIMED_OUT) for i in items):
            await self.call(A, stream, route, "delegate_to_employee",
                            {"to": B, "task": "again", "deadline_s": DEADLINE_S}, context,
                            tasks, now)  # fmt: skip

    async def deadlines(self, now: datetime) -> None:
        """What the supervisors' alarm timers would fire by now: tasks past their deadline
        time out (on the simulated clock)."""
        async with self.pool.connection() as conn:
            for employee in (A, B):
                self.timed_out += (await fire_due(conn, employee, 1, "UTC", now=now)).fired

    async def route(self, now: datetime) -> None:
        async with self.pool.connection() as conn:
            while (await route_pass(conn, now=now)).rows:
                pass
            await flush_due(conn, now)
            while (await route_pass(conn, now=now)).rows:
                pass


async def crossing_per_minute(pool: AsyncConnectionPool[Conn]) -> dict[int, tuple[int, int]]:
    """Per simulated minute: (wakes A → B delivered one by one, digests delivered)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT d.type, d.payload->>'bench_minute' AS m, count(*) AS n FROM bus_deliveries d "
            "WHERE d.stream_key LIKE %s GROUP BY 1, 2", (f"{B}/%",))  # fmt: skip
        rows = await cur.fetchall()
    out: dict[int, tuple[int, int]] = {}
    for r in rows:
        one, digests = out.get(int(r["m"] or -1), (0, 0))
        if r["type"] == names.TYPE_IPC_DIGEST:
            digests += int(r["n"])
        else:
            one += int(r["n"])
        out[int(r["m"] or -1)] = (one, digests)
    return out


async def stamp(pool: AsyncConnectionPool[Conn], minute: int) -> None:
    """Mark this minute's new deliveries with the simulated minute (for the figures)."""
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE bus_deliveries SET payload = payload || jsonb_build_object('bench_minute', "
            "%s::int) WHERE NOT payload ? 'bench_minute'", (minute,))  # fmt: skip
        await conn.commit()


def outcome(status: str, error: str | None) -> str:
    """An ingress row's outcome without its details: `loop_suppressed: cycle`, `digested`."""
    if not error:
        return str(status)
    head, _, rest = error.partition(": ")
    return f"{head}: {rest.split(' ')[0]}" if rest else head


async def figures(pool: AsyncConnectionPool[Conn]) -> dict[str, Any]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT status, error FROM bus_ingress "
                                 "WHERE source_key LIKE 'ipc:%%'")  # fmt: skip
        cuts = Counter(outcome(r["status"], r["error"]) for r in await cur.fetchall())
        cur = await conn.execute(
            "SELECT e.sender, e.target, e.breaker, e.passed, e.digested, e.suppressed, "
            "(SELECT coalesce(sum(d.sent), 0) FROM storm_digests d WHERE d.sender = e.sender "
            "AND d.target = e.target) AS digests_sent FROM storm_edges e ORDER BY 1, 2"
        )
        edges = [dict(r) for r in await cur.fetchall()]
        cur = await conn.execute("SELECT kind, ref, count FROM attention_items ORDER BY 1, 2")
        items = [dict(r) for r in await cur.fetchall()]
        cur = await conn.execute("SELECT status, count(*) AS n FROM ipc_tasks GROUP BY 1")
        tasks = {str(r["status"]): int(r["n"]) for r in await cur.fetchall()}
    return {"ingress_by_reason": cuts, "edges": edges, "attention": items, "tasks": tasks}


async def storm(db: DatabaseSettings, minutes: int, tick_s: float, kick_every_s: float) -> None:
    async with await open_pool(db) as pool:
        s = Storm(pool)
        started, now, next_kick = time.monotonic(), T0, T0
        end = T0 + timedelta(minutes=minutes)
        minute = 0
        while now < end:
            if now >= next_kick:
                await s.kick(now)
                next_kick += timedelta(seconds=kick_every_s)
            await s.route(now)
            await s.deadlines(now)
            await s.turns_pass(now)
            await s.route(now)
            await stamp(pool, int((now - T0).total_seconds() // 60))
            now += timedelta(seconds=tick_s)
            if int((now - T0).total_seconds() // 600) != minute // 10:
                minute = int((now - T0).total_seconds() // 60)
                progress(f"simulated minute {minute}: {sum(s.calls.values())} tool calls")
        wall = time.monotonic() - started
        report(await figures(pool), await crossing_per_minute(pool), s, minutes, wall)


def report(fig: dict[str, Any], per_minute: dict[int, tuple[int, int]], s: Storm, minutes: int,
           wall: float) -> None:  # fmt: skip
    print(f"simulated {minutes} min in {wall:.1f} s wall; {s.turns} instant turns")
    print("tool calls:", dict(sorted(s.calls.items())))
    print("ipc ingress rows by outcome:", dict(sorted(fig["ingress_by_reason"].items())))
    print("tasks:", fig["tasks"], f"({s.timed_out} deadlines fired)")
    for e in fig["edges"]:
        print(f"edge {e['sender']} -> {e['target']}: breaker {e['breaker']}, "
              f"passed {e['passed']}, digested {e['digested']}, suppressed {e['suppressed']}, "
              f"digests {e['digests_sent']}")  # fmt: skip
    for i in fig["attention"]:
        print(f"attention {i['kind']} {i['ref']} x{i['count']}")
    ones = [per_minute.get(m, (0, 0))[0] for m in range(minutes)]
    digests = [per_minute.get(m, (0, 0))[1] for m in range(minutes)]
    print("A -> B inputs delivered one by one, per minute, first 10 minutes:", ones[:10])
    for lo, hi in ((0, 3), (3, 63), (63, minutes)):
        if lo >= minutes:  # a short run (--quick) has no later spans
            break
        span = max(hi - lo, 1)
        print(f"minutes {lo}-{hi}: {sum(ones[lo:hi]) / span:.2f}/min one by one (max "
              f"{max(ones[lo:hi] or [0])}), {sum(digests[lo:hi])} digests "
              f"({sum(digests[lo:hi]) / span * 15:.2f} per 15 min)")  # fmt: skip


async def run(folder: Path, minutes: int, tick_s: float, kick_every_s: float) -> None:
    with fresh_database(folder, "eventos_storm") as url:
        db = DatabaseSettings(url=url, pool_max=10)
        async with await connect(db) as conn:
            await migrate(conn)
            for doc in load_specs("---".join(spec(e) for e in (A, B))):
                await lifecycle.apply(conn, doc, LlmEndpoints(), SecretPurposes())
                await lifecycle.start(conn, doc.name)
                await lifecycle.activate(conn, doc.name)
        await storm(db, minutes, tick_s, kick_every_s)


def main() -> int:
    exit_on_signals()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=150)
    parser.add_argument("--tick", type=float, default=2.0, help="simulated seconds per pass")
    parser.add_argument("--kick-every", type=float, default=10.0)
    args = parse_with_quick(parser, {"minutes": 1})
    return run_in_temp_folder(
        "eventos-storm-", lambda f: run(f, args.minutes, args.tick, args.kick_every)
    )


if __name__ == "__main__":
    raise SystemExit(main())
