"""What one turn of each kind costs Temporal, read from its real histories (issue 27 point 2).

    .venv/bin/python bench/turn_commands.py [--repeat 3] [--quick]

Starts an embedded PostgreSQL and the Temporal dev server (or uses EVENTOS_DATABASE_URL's server
and TEMPORAL_ADDRESS), the ingress in this process (owner chat, webhooks, the Telegram reader on
the loopback Bot API fake of the test tree), the router's and relay's loops, and the workflow,
LLM (local provider) and egress workers. One employee per kind, each a fresh conversation:

- `chat`: an owner message answered in one step;
- `tool`: an owner message whose step calls a tool, then answers;
- `webhook`: a generic webhook (no reply route: nothing is sent);
- `customer`: a Telegram customer's message (2 s debounce), answered through egress.

Each kind runs `--repeat` times, one input at a time, each time waiting until its turn has
ended and its entity gave the slot back. Then it prints, per kind and per input (the entity's
run plus the turn and anything the turn started, divided by the inputs), the workflow tasks
and the commands they made: activities, local activities, timers, Signals (sent and received),
child workflows, patch markers, and the history events; and the Temporal actions (SPEC §14's
unit: starts, Signals, activities, local activities, timers, child workflows). `--events`
also prints each history of the last input of every kind, event by event. Every history read
is also replayed on this code (a nondeterminism stops the bench).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
from channels import ADMIN, TESTS, enter_workers, ingress_in_process, pump
from harness import (
    exit_on_signals,
    fresh_database,
    local_employee,
    parse_with_quick,
    progress,
    run_in_temp_folder,
    table,
    temporal_server,
)
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.worker import Replayer

from eventos.channels.settings import ChannelSettings
from eventos.db import Conn, connect, open_pool
from eventos.db.migrate import migrate
from eventos.delivery.relay import Relay
from eventos.employees import lifecycle
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.keys import OutboxKeys, new_key_entry
from eventos.runtime.payload_guard import connect as temporal_connect
from eventos.runtime.temporal import TemporalConnection
from eventos.secret_purposes import SecretPurposes
from eventos.settings import DatabaseSettings, SecretStore
from eventos.spec.model import load_specs
from eventos.workers.roles import WORKFLOWS

KINDS = ("chat", "tool", "webhook", "customer")
TRIGGERS = {
    "chat": "{kind: chat}",
    "tool": "{kind: chat}",
    "webhook": "{kind: webhook, path: bench-hook, verify: {scheme: none}, "
    "dedupe_header: X-Event-Id}",
    "customer": "{kind: telegram, account: tg-bench}",
}
TURN_TIMEOUT_S = 60.0
E = EventType
COLUMNS = {  # column: the history events that count toward it
    "activities": {E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED},
    "timers": {E.EVENT_TYPE_TIMER_STARTED},
    "signals in": {E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED},
    "signals out": {E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED},
    "children": {E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED},
    "wf tasks": {E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED},
}
# The events a workflow task's commands write (a patch marker writes a marker and, by the SDK, a
# search-attribute upsert).
COMMANDS = {
    E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
    E.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED,
    E.EVENT_TYPE_MARKER_RECORDED,
    E.EVENT_TYPE_TIMER_STARTED,
    E.EVENT_TYPE_TIMER_CANCELED,
    E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
    E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
    E.EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
    E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
    E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}
# Temporal's billed actions (SPEC §14): a start, a Signal, an activity or a local activity, a
# timer, a child workflow's start; a patch marker is a command but not an action.
ACTIONS = ("starts", "activities", "local acts", "timers", "signals in", "children")


def count(events: list[HistoryEvent]) -> collections.Counter[str]:
    """One workflow run's history, by the columns above."""
    out: collections.Counter[str] = collections.Counter()
    for e in events:
        for column, kinds in COLUMNS.items():
            out[column] += e.event_type in kinds
        if e.event_type == E.EVENT_TYPE_MARKER_RECORDED:
            patch = e.marker_recorded_event_attributes.marker_name == "core_patch"
            out["patches" if patch else "local acts"] += 1
        out["starts"] += e.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED and (
            not e.workflow_execution_started_event_attributes.HasField("parent_workflow_execution")
        )
        out["commands"] += e.event_type in COMMANDS
        out["events"] += 1
    return out


async def history(client: Client, workflow_id: str) -> list[HistoryEvent]:
    """The run's history, replayed on this code first (raises on a nondeterminism)."""
    recorded = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(workflows=WORKFLOWS, data_converter=client.data_converter)
    await replayer.replay_workflow(recorded)
    return list(recorded.events)


async def rows(pool: AsyncConnectionPool[Conn], q: str, *args: object) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(q, args)
        return list(await cur.fetchall())


def show(title: str, events: list[HistoryEvent]) -> None:
    """A history, one event a line: its type, and the activity, marker, timer or Signal."""
    print(f"\n{title}")
    for e in events:
        kind = E.Name(e.event_type).removeprefix("EVENT_TYPE_")
        what = (e.activity_task_scheduled_event_attributes.activity_type.name
                or e.marker_recorded_event_attributes.marker_name
                or e.workflow_execution_signaled_event_attributes.signal_name
                or e.signal_external_workflow_execution_initiated_event_attributes.signal_name
                or e.timer_started_event_attributes.timer_id)  # fmt: skip
        print(f"  {e.event_id:>3} {kind} {what}")


async def one_turn(pool: AsyncConnectionPool[Conn], client: Client, employee: str,
                   send: Any, trace: bool = False) -> collections.Counter[str]:  # fmt: skip
    """Send one input, wait for its turn to end and its slot to come back; what the turn and
    the entity's run so far made (the entity's history is cumulative: the caller differences)."""
    before = {r["id"] for r in await rows(pool, "SELECT id FROM turns WHERE employee = %s",
                                          employee)}  # fmt: skip
    await send()
    deadline = asyncio.get_running_loop().time() + TURN_TIMEOUT_S
    while True:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{employee}: no turn ended within {TURN_TIMEOUT_S:.0f} s")
        found = await rows(pool, "SELECT id, status FROM turns WHERE employee = %s", employee)
        new = [r for r in found if r["id"] not in before]
        held = await rows(pool, "SELECT 1 FROM sched_leases WHERE employee = %s", employee)
        if new and all(r["status"] != "running" for r in new) and not held:
            break
        await asyncio.sleep(0.1)
    total: collections.Counter[str] = collections.Counter()
    for turn in new:
        await client.get_workflow_handle(turn["id"]).result()
        events = await history(client, turn["id"])
        total += count(events)
        if trace:
            show(f"turn {turn['id']}", events)
        for e in events:  # the turn's children (an approval)
            if e.HasField("start_child_workflow_execution_initiated_event_attributes"):
                child = e.start_child_workflow_execution_initiated_event_attributes.workflow_id
                total += count(await history(client, child))
    total["turns"] = len(new)
    return total


async def entities(pool: AsyncConnectionPool[Conn], employee: str) -> list[str]:
    """The entities of the employee's conversations (one per kind here)."""
    found = await rows(pool, "SELECT entity_id FROM bus_streams WHERE employee = %s", employee)
    return [str(r["entity_id"]) for r in found]


async def measure(args: argparse.Namespace, db: DatabaseSettings, ts: Any, fake: Any) -> None:
    token = fake.add_bot("bench_bot")
    secrets = SecretStore(env={"EVENTOS_SECRET_TG_BENCH": token,
                               "EVENTOS_SECRETS_PURPOSES": "tg-bench=channel"})  # fmt: skip
    channels = ChannelSettings(telegram_api=fake.base_url, poll_timeout_s=5, refresh_s=1)
    keys = OutboxKeys.parse(new_key_entry("bench"))
    pool = await open_pool(db)
    client = await temporal_connect(ts.address, ts.namespace)
    try:
        async with ingress_in_process(db, secrets, channels) as ingress:
            results = await drive(args, ts, client, pool, fake, token, secrets, channels, keys,
                                  f"http://127.0.0.1:{ingress.bound_http_port}")  # fmt: skip
    finally:
        await pool.close()
    report(results, args.repeat)


async def drive(args: argparse.Namespace, ts: Any, client: Client,
                pool: AsyncConnectionPool[Conn], fake: Any, token: str, secrets: SecretStore,
                channels: ChannelSettings, keys: OutboxKeys,
                base: str) -> dict[str, collections.Counter[str]]:  # fmt: skip
    """Workers and loops up, each kind's inputs sent one at a time: what each kind cost."""
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient() as http, contextlib.AsyncExitStack() as stack, \
            httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as api:  # fmt: skip
        await enter_workers(stack, client, pool, http, fake.base_url, keys, secrets, channels, 4)
        relay = Relay(pool, TemporalConnection(ts), "bench")
        pumping = asyncio.create_task(pump(pool, relay))
        try:
            sends = {
                "chat": lambda e, n: api.post(f"/v1/employees/{e}/chat", json={
                    "client_message_id": uuid.uuid4().hex, "text": f"hello {n}"}),
                "tool": lambda e, n: api.post(f"/v1/employees/{e}/chat", json={
                    "client_message_id": uuid.uuid4().hex,
                    "text": f'look it up {n}\ncall: lookup {{"q": {n}}}'}),
                "webhook": lambda e, n: api.post("/hooks/bench-hook", json={"n": n},
                                                  headers={"X-Event-Id": uuid.uuid4().hex}),
                "customer": lambda e, n: asyncio.to_thread(
                    fake.customer_message, token, 7_000_001, f"order question {n}"),
            }  # fmt: skip
            results: dict[str, collections.Counter[str]] = {}
            for kind in KINDS:
                employee = f"k-{kind}"
                total: collections.Counter[str] = collections.Counter()
                for n in range(args.repeat):
                    last = args.events and n == args.repeat - 1
                    send = functools.partial(sends[kind], employee, n)
                    total += await one_turn(pool, client, employee, send, last)
                for entity in await entities(pool, employee):
                    events = await history(client, entity)
                    total += count(events)
                    if args.events:
                        show(f"entity {entity}", events)
                results[kind] = total
                progress(f"{kind}: {args.repeat} inputs, {total['turns']} turns")
        finally:
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumping
    return results


def report(results: dict[str, collections.Counter[str]], inputs: int) -> None:
    columns = ["wf tasks", "commands", "activities", "local acts", "timers", "signals in",
               "signals out", "children", "patches", "events"]  # fmt: skip
    out = []
    for kind, c in results.items():
        actions = sum(c[a] for a in ACTIONS)
        out.append([kind, f"{c['turns'] / inputs:.2f}"]
                   + [f"{c[col] / inputs:.2f}" for col in columns]
                   + [f"{actions / inputs:.2f}"])  # fmt: skip
    print(f"\nper input (the entity's run, the turn and its children; {inputs} inputs a kind, "
          "one at a time):")  # fmt: skip
    print(table(["kind", "turns", *columns, "actions"], out))


async def run(args: argparse.Namespace, folder: Path) -> None:
    with fresh_database(folder, "eventos_turn_commands") as url, temporal_server(folder) as ts:
        db = DatabaseSettings(url=url, pool_max=20)
        async with await connect(db) as conn:
            await migrate(conn)
            purposes = SecretPurposes.parse("tg-bench=channel")
            for kind in KINDS:
                (doc,) = load_specs(local_employee(f"k-{kind}", f"[{TRIGGERS[kind]}]"))
                await lifecycle.apply(conn, doc, LlmEndpoints(), purposes)
                await lifecycle.start(conn, f"k-{kind}")
                await lifecycle.activate(conn, f"k-{kind}")
        sys.path.insert(0, str(TESTS))
        from fake_telegram import FakeTelegram

        fake = FakeTelegram()
        await fake.start()
        try:
            await measure(args, db, ts, fake)
        finally:
            await fake.stop()


def main() -> int:
    exit_on_signals()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="inputs of each kind")
    parser.add_argument("--events", action="store_true", help="print the last input's histories")
    args = parse_with_quick(parser, {"repeat": 1})
    return run_in_temp_folder("eventos-turn-commands-", lambda folder: run(args, folder))


if __name__ == "__main__":
    raise SystemExit(main())
