"""Tier L on the real open-source Temporal server (SPEC §14), every service a process and the LLM
workers one process per class (LLM_CLASS=c1 … c4), as the chart deploys them.

The server is the session's `tier_l_server` (the chart's config, 4 history shards); each test
works in a namespace of its own on it:

- the owner's chat and a customer's webhook answered end to end, each LLM step run by its
  class's worker;
- EG13: the server's databases dropped and created again by temporal-sql-tool while turns run:
  after a re-arm every acknowledged event is consumed once, the supervisor and the cron Schedule
  exist again;
- the S→L move of docs/deploy.md §10, executed: a tier S instance with work in flight is stopped
  at its checkpoints, its services come back on the tier L server, re-arm, resume; nothing is
  lost and nothing doubled.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import E2E_TIMEOUT_S, SECRETS
from stack import Owner, Stack, base_env, one, reply_rows, rows, run_async, until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from test_rearm import SUPERVISED, leftovers
from test_temporal_outage import SPEC, Sender, all_done, answered

from eventos import names
from eventos.local.temporal_dev import TemporalDevServer
from eventos.local.temporal_server import TemporalServer
from eventos.settings import DatabaseSettings, TemporalSettings

# Whole stacks of processes on a small shared machine: a longer hang limit than the default.
pytestmark = [pytest.mark.stack, pytest.mark.tier_l, pytest.mark.timeout(E2E_TIMEOUT_S)]

NAME = "ops"


def stack_env(db: DatabaseSettings, temporal: TemporalSettings, tmp_path: Path) -> dict[str, str]:
    env = base_env(db.url, temporal.address, temporal.namespace, tmp_path / "blobs")
    env.update(SECRETS)
    return env


@pytest.fixture
def stack_l(
    db_settings: DatabaseSettings,
    tier_l_server: TemporalServer,
    tier_l_temporal: TemporalSettings,
    tmp_path: Path,
) -> Iterator[Stack]:
    env = stack_env(db_settings, tier_l_temporal, tmp_path)
    with Stack(env, tmp_path, tier="L", watch=(tier_l_server.log_path,)) as running:
        yield running


async def llm_workers_of(temporal: TemporalSettings, turn_ids: list[str]) -> dict[str, set[str]]:
    """Per turn, the identities of the workers that started its LLM steps (activities on an
    `llm-c*` queue)."""
    client = await Client.connect(temporal.address, namespace=temporal.namespace)
    found: dict[str, set[str]] = {}
    for turn_id in turn_ids:
        queue_of: dict[int, str] = {}
        found[turn_id] = set()
        async for event in client.get_workflow_handle(turn_id).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                queue_of[event.event_id] = attrs.task_queue.name
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                started = event.activity_task_started_event_attributes
                if queue_of.get(started.scheduled_event_id, "").startswith("llm-c"):
                    found[turn_id].add(started.identity)
    return found


def test_owner_chat_and_a_webhook_are_answered_each_by_its_class_worker(
    stack_l: Stack, tier_l_temporal: TemporalSettings, db_settings: DatabaseSettings
) -> None:
    url = db_settings.url
    owner = Owner(stack_l.ingress_url)
    owner.apply_and_start(SPEC, NAME)
    send = Sender(owner)
    message = send.chat("hello from tier L")
    send.hook()
    until(lambda: answered(owner, [message]) and all_done(url), 90, "both served", stack_l)
    reply = owner.message(NAME, message)["reply"]
    assert "hello from tier L" in str(reply), reply
    turns = rows(url, "SELECT id, class, status FROM turns ORDER BY class")
    assert [(t["class"], t["status"]) for t in turns] == [(1, "done"), (3, "done")]
    # The worker identity is `<pid>@<host>`: each step ran in its class's own process.
    ran = run_async(llm_workers_of(tier_l_temporal, [t["id"] for t in turns]))
    for turn in turns:
        worker = stack_l[f"workers-llm-c{turn['class']}"].proc
        assert {i.split("@")[0] for i in ran[turn["id"]]} == {str(worker.pid)}, ran
    assert rows(url, "SELECT status FROM outbound_messages") == [{"status": "sent"}]


def start_ticks(url: str) -> int:
    return int(one(url, "SELECT count(*) FROM bus_ingress WHERE source_key = %(s)s",
                   {"s": f"start:{NAME}/start"}))  # fmt: skip


async def supervised_view(temporal: TemporalSettings) -> tuple[bool, bool]:
    """Whether the supervisor runs and the cron Schedule exists."""
    client = await Client.connect(temporal.address, namespace=temporal.namespace)
    sup = await client.get_workflow_handle(names.supervisor_id(NAME, 1)).describe()
    try:
        await client.get_schedule_handle(names.schedule_id(NAME, 1, "nightly")).describe()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return sup.status == WorkflowExecutionStatus.RUNNING, False
    return sup.status == WorkflowExecutionStatus.RUNNING, True


def intent_applied(owner: Owner, answer: Any, stack: Stack) -> None:
    """Wait until the intent of a 202 answer is applied (what `eventosctl … --wait` does)."""
    assert answer.status_code == 202, answer.text
    doc = answer.json()
    intent_id = doc["intent"]["id"] if "intent" in doc else doc["id"]
    until(lambda: owner.call("GET", f"/v1/intents/{intent_id}").json()["state"] == "applied",
          60, f"intent {intent_id} applied", stack)  # fmt: skip


def assert_consumed_once(url: str, send: Sender) -> None:
    """Every acknowledged event routed once and consumed; each owner message answered by its
    turn's one reply, sent once; no turn running and no slot held."""
    ingress = rows(url, "SELECT id, status FROM bus_ingress WHERE source_key <> %(s)s ORDER BY id",
                   {"s": f"start:{NAME}/start"})  # fmt: skip
    assert len(ingress) == len(send.hooks) + len(send.messages)
    assert {r["status"] for r in ingress} == {"routed"}
    deliveries = rows(url, "SELECT ingress_id, status FROM bus_deliveries ORDER BY ingress_id")
    assert len({d["ingress_id"] for d in deliveries}) == len(deliveries)  # routed once
    assert {d["status"] for d in deliveries} == {"done"}
    messages = rows(url, "SELECT id, status, turn_id FROM chat_messages ORDER BY id")
    assert [m["id"] for m in messages] == send.messages
    assert {m["status"] for m in messages} == {"answered"}
    replies = reply_rows(url)
    assert sorted(r["turn_id"] for r in replies) == sorted({m["turn_id"] for m in messages})
    outbox = rows(url, "SELECT turn_id, status FROM outbound_messages")
    assert len(outbox) == len(replies) and {o["status"] for o in outbox} == {"sent"}
    assert {t["status"] for t in rows(url, "SELECT status FROM turns")} <= {
        "done",
        "cancelled",
        "interrupted",
    }
    assert rows(url, "SELECT * FROM sched_leases") == []
    assert start_ticks(url) == 1  # `start` fired once for the generation, never again


def test_eg13_databases_recreated_by_the_schema_tool_then_rearmed_lose_nothing(
    stack_l: Stack,
    tier_l_server: TemporalServer,
    tier_l_temporal: TemporalSettings,
    db_settings: DatabaseSettings,
) -> None:
    url = db_settings.url
    owner = Owner(stack_l.ingress_url)
    owner.apply_and_start(SUPERVISED, NAME)
    send = Sender(owner)
    warm = send.chat("before")
    until(lambda: answered(owner, [warm]) and all_done(url), 60, "warm-up served", stack_l)
    for i in range(3):  # turns in flight when the server loses everything: 5 s model steps
        send.hook()
        send.chat(f"slow one {i}\nsleep: 5")
    until(lambda: one(url, "SELECT count(*) FROM turns WHERE status = 'running' AND class = 1")
          == 1, 30, "the owner's slow turn running", stack_l)  # fmt: skip

    tier_l_server.stop()
    tier_l_server.drop_databases()
    assert not tier_l_server._database_exists(tier_l_server.database)
    tier_l_server.start()  # same ports; databases created and their schemas applied again
    tier_l_server.ensure_namespace(tier_l_temporal.namespace)
    send.hook()
    send.chat("after the loss")
    intent_applied(owner, owner.call("POST", "/v1/rearm"), stack_l)
    try:
        until(lambda: all_done(url) and answered(owner, send.messages), 150,
              "everything consumed after the re-arm", stack_l)  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{leftovers(url)}\n{exc}") from None
    assert_consumed_once(url, send)
    until(lambda: run_async(supervised_view(tier_l_temporal)) == (True, True), 30,
          "the supervisor running and the cron Schedule there again", stack_l)  # fmt: skip


def test_the_s_to_l_move_of_the_deploy_guide_loses_and_doubles_nothing(
    tier_l_server: TemporalServer,
    tier_l_temporal: TemporalSettings,
    db_settings: DatabaseSettings,
    tmp_path: Path,
) -> None:
    url = db_settings.url
    dev = TemporalDevServer(tmp_path / "temporal")
    dev.start()
    tier_s = TemporalSettings(address=dev.address, namespace=dev.namespace)
    try:
        with Stack(stack_env(db_settings, tier_s, tmp_path), tmp_path / "s") as stack_s:
            owner = Owner(stack_s.ingress_url)
            owner.apply_and_start(SUPERVISED, NAME)
            send = Sender(owner)
            warm = send.chat("at tier S")
            until(lambda: answered(owner, [warm]) and all_done(url), 60, "tier S serves", stack_s)
            # Work in flight: a slow owner turn (two steps, a merge point between) and webhooks.
            send.chat("long chore\nsleep: 3\ncall: lookup {}")
            for _ in range(3):
                send.hook()
            until(lambda: one(url, "SELECT count(*) FROM turns WHERE status = 'running'") > 0,
                  30, "a turn running", stack_s)  # fmt: skip
            # 1. Stop the employee at its checkpoints; 2. wait for the turns in flight to end.
            intent_applied(owner, owner.call("POST", f"/v1/employees/{NAME}:stop"), stack_s)
            until(lambda: one(url, "SELECT count(*) FROM turns WHERE status = 'running'") == 0,
                  60, "no turn running", stack_s)  # fmt: skip
            send.hook()  # inputs arriving while stopped wait in the database
            send.chat("while moving")
    finally:
        dev.stop()
    # 3. The services on the full server (the chart keeps TEMPORAL_ADDRESS; here it changes).
    env_l = stack_env(db_settings, tier_l_temporal, tmp_path)
    with Stack(env_l, tmp_path / "l", tier="L", watch=(tier_l_server.log_path,)) as stack_l:
        owner = Owner(stack_l.ingress_url)
        # 4. Re-arm from the database; 5. resume the employee stopped in step 1.
        intent_applied(owner, owner.call("POST", "/v1/rearm"), stack_l)
        intent_applied(owner, owner.call("POST", f"/v1/employees/{NAME}:resume"), stack_l)
        send.owner = owner
        send.chat("at tier L")
        try:
            until(lambda: all_done(url) and answered(owner, send.messages), 120,
                  "everything consumed at tier L", stack_l)  # fmt: skip
        except AssertionError as exc:
            raise AssertionError(f"{leftovers(url)}\n{exc}") from None
        assert_consumed_once(url, send)
        until(lambda: run_async(supervised_view(tier_l_temporal)) == (True, True), 30,
              "the supervisor and the cron Schedule on the tier L server", stack_l)  # fmt: skip
        assert one(url, "SELECT state FROM generations") == names.GEN_RUNNING
