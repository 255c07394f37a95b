"""Temporal is rebuildable from the database (I10), with every service a process:

- EG10: restarting every service twice fires a generation's `start` trigger once;
- EG13: the dev server is stopped, its database file deleted and the server started empty while
  turns were running: after a re-arm every acknowledged event is processed exactly once and the
  supervisor and the cron Schedule exist again.

Each test runs its own dev server (test_temporal_outage's fixtures), because EG13 empties it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import E2E_TIMEOUT_S
from stack import Owner, Stack, one, reply_rows, rows, run_async, until
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from test_temporal_outage import SPEC, Sender, all_done, answered, stack, temporal  # noqa: F401

from eventos import names
from eventos.local.temporal_dev import TemporalDevServer
from eventos.settings import DatabaseSettings

# Whole stacks of processes on a small shared machine: a longer hang limit than the default.
pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

NAME = "ops"
SUPERVISED = (
    SPEC
    + """    - {kind: start, text: good morning}
    - {kind: cron, name: nightly, schedule: "0 3 * * *"}
"""
)


def start_ticks(url: str) -> int:
    return int(one(url, "SELECT count(*) FROM bus_ingress WHERE source_key = %(s)s",
                   {"s": f"start:{NAME}/start"}))  # fmt: skip


async def temporal_view(server: TemporalDevServer) -> tuple[bool, bool]:
    """Whether the supervisor runs and the cron Schedule exists. The re-arm starts the
    supervisor; its first run creates the Schedule afterwards, in an activity."""
    client = await Client.connect(server.address, namespace=server.namespace)
    sup = await client.get_workflow_handle(names.supervisor_id(NAME, 1)).describe()
    try:
        await client.get_schedule_handle(names.schedule_id(NAME, 1, "nightly")).describe()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return sup.status == WorkflowExecutionStatus.RUNNING, False
    return sup.status == WorkflowExecutionStatus.RUNNING, True


def test_restarting_every_service_twice_fires_start_once(
    stack: Stack, db_settings: DatabaseSettings
) -> None:
    url = db_settings.url
    owner = Owner(stack.ingress_url)
    owner.apply_and_start(SUPERVISED, NAME)
    until(lambda: one(url, "SELECT count(*) FROM bus_deliveries WHERE status = 'done'") == 1,
          60, "the start tick consumed", stack)  # fmt: skip
    for _ in range(2):
        stack.stop()
        stack.start()
    message = owner.chat(NAME, "still there?")
    until(lambda: answered(owner, [message]), 60, "the owner answered after the restarts", stack)
    assert start_ticks(url) == 1
    rearms = rows(url, "SELECT state FROM intents WHERE kind = 'rearm'")
    until(lambda: {r["state"] for r in rows(url, "SELECT state FROM intents")} == {"applied"},
          30, "every intent applied", stack)  # fmt: skip
    assert len(rearms) == 3  # one per relay boot


def test_an_emptied_temporal_database_is_rearmed_and_loses_nothing(
    stack: Stack, temporal: TemporalDevServer, db_settings: DatabaseSettings
) -> None:
    url = db_settings.url
    owner = Owner(stack.ingress_url)
    owner.apply_and_start(SUPERVISED, NAME)
    send = Sender(owner)
    warm = send.chat("before")
    until(lambda: answered(owner, [warm]) and all_done(url), 60, "warm-up served", stack)
    # Turns in flight when Temporal loses everything: each sleeps 5 s in its model step.
    for i in range(3):
        send.hook()
        send.chat(f"slow one {i}\nsleep: 5")
    until(lambda: one(url, "SELECT count(*) FROM turns WHERE status = 'running' AND class = 1")
          == 1, 30, "the owner's slow turn running", stack)  # fmt: skip

    temporal.stop()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{temporal.db_path}{suffix}").unlink(missing_ok=True)
    temporal.start()  # same ports, an empty database
    send.hook()
    send.chat("after the loss")
    answer = owner.call("POST", "/v1/rearm")
    assert answer.status_code == 202, answer.text
    rearm_id = answer.json()["id"]
    until(lambda: one(url, "SELECT state FROM intents WHERE id = %(i)s", {"i": rearm_id})
          == "applied", 60, "the re-arm applied", stack)  # fmt: skip
    try:
        until(lambda: all_done(url) and answered(owner, send.messages), 120,
              "everything consumed after the re-arm", stack)  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{leftovers(url)}\n{exc}") from None

    ingress = rows(url, "SELECT id, status FROM bus_ingress WHERE source_key <> %(s)s ORDER BY id",
                   {"s": f"start:{NAME}/start"})  # fmt: skip
    assert len(ingress) == len(send.hooks) + len(send.messages)
    assert {r["status"] for r in ingress} == {"routed"}
    deliveries = rows(url, "SELECT ingress_id, status FROM bus_deliveries ORDER BY ingress_id")
    assert len({d["ingress_id"] for d in deliveries}) == len(deliveries)  # routed once
    assert {d["status"] for d in deliveries} == {"done"}
    # Each owner message answered once: one sent reply per answering turn, none twice.
    messages = rows(url, "SELECT id, status, turn_id FROM chat_messages ORDER BY id")
    assert [m["id"] for m in messages] == send.messages
    assert {m["status"] for m in messages} == {"answered"}
    replies = reply_rows(url)
    assert sorted(r["turn_id"] for r in replies) == sorted({m["turn_id"] for m in messages})
    outbox = rows(url, "SELECT turn_id, status FROM outbound_messages")
    assert len(outbox) == len(replies) and {o["status"] for o in outbox} == {"sent"}
    assert {t["status"] for t in rows(url, "SELECT status FROM turns")} <= {"done", "cancelled"}
    assert rows(url, "SELECT * FROM sched_leases") == []
    assert start_ticks(url) == 1  # the rebuilt supervisor did not fire `start` again
    until(lambda: run_async(temporal_view(temporal)) == (True, True), 30,
          "the supervisor running and the cron Schedule there again", stack)  # fmt: skip


def leftovers(url: str) -> str:
    """What is not settled yet, for a failure message."""
    return "\n".join(f"{q}: {rows(url, q)}" for q in (
        "SELECT stream_key, seq, status FROM bus_deliveries WHERE status <> 'done'",
        "SELECT stream_key, delivered_seq, consumed_seq, hold_reason FROM bus_streams",
        "SELECT turn_id, class, state FROM sched_leases",
        "SELECT id, status FROM turns ORDER BY started_at",
        "SELECT id, status, turn_id FROM chat_messages WHERE status <> 'answered'",
        "SELECT id, turn_id, status FROM outbound_messages WHERE status <> 'sent'",
    ))  # fmt: skip
