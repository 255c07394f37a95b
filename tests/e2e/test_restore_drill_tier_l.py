"""The restore drill at tier L (issue 29 point 3, RFC-0005 §21.3; docs/backups.md): the six
services as processes (the LLM workers one per class) on the open-source Temporal server of the
session (`tier_l_server`, its two databases on the test PostgreSQL), with a Telegram bot on its
loopback fake, an owner's alarm and a cron Schedule.

Customers write and are answered, the owner sets an alarm, two turns run; the backup dumps the
app database and Temporal's two. After it the turns finish and reply, a customer writes and is
answered, and a workflow of the backup's time is deleted from Temporal. A restore while the
Temporal server runs is refused and touches nothing; the restore that stops and starts the
server (as its operator) puts all three databases back. Then every message acknowledged before
the backup is consumed once, no reply is sent twice, the orphaned turns failed and their runs
ended, the supervisor, the Schedule and the alarm work again, and Temporal's histories are the
backup's: the deleted workflow is there again, the later one is not."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import E2E_TIMEOUT_S
from fleet_helpers import cleanup_restore_leftovers, settings_for
from stack import Owner, Stack, one, rows, run_async, until
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from test_channel_faults import (  # noqa: F401 (telegram, bot: fixtures)
    ACCOUNT,
    FakeInThread,
    account_up,
    bot,
    telegram,
    telegram_env,
    updates_in_inbox,
)
from test_restore_drill import all_consumed, answered_then_running

from eventos import names
from eventos.fleet.backups import RestoreRefused, restore_backup, take_backup
from eventos.fleet.pgtools import with_database
from eventos.local.temporal_server import TemporalServer
from eventos.settings import (
    TEMPORAL_DATABASE,
    VISIBILITY_DATABASE,
    BackupSettings,
    BackupTarget,
    DatabaseSettings,
    TemporalSettings,
)
from eventos.testing.plugin import TIER_L_START_S, PostgresForTests

pytestmark = [pytest.mark.stack, pytest.mark.tier_l, pytest.mark.timeout(E2E_TIMEOUT_S)]

NAME = "shop"
SPEC = f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {NAME}}}
spec:
  agents:
    - {{name: front, model: {{provider: local, name: scripted}}, system: You help.,
       tools: [set_alarm]}}
  triggers:
    - {{kind: telegram, account: {ACCOUNT}}}
    - {{kind: chat}}
    - {{kind: cron, name: nightly, schedule: "0 3 * * *"}}
"""
BEFORE = (8001, 8002)  # answered before the backup
RUNNING = (8003, 8004)  # their turns run while the backup is taken
AFTER = 8005  # writes after the backup
ALARM_IN_S = 120  # set before the backup, due after the restore on a usual run


@dataclass
class ServerControl:
    """The operator's hands on the tier L server: stop it; start it on the same ports without
    waiting for it, as `make run`'s supervisor does on its next pass (the restore waits)."""

    server: TemporalServer
    stops: int = 0
    starting: threading.Thread | None = None

    async def stop(self) -> None:
        await asyncio.to_thread(self.server.stop)
        self.stops += 1

    async def start(self) -> None:
        self.starting = threading.Thread(target=self.server.start, args=(TIER_L_START_S,))
        self.starting.start()


@pytest.fixture
def drill_stack(db_settings: DatabaseSettings, tier_l_server: TemporalServer,
                tier_l_temporal: TemporalSettings, telegram: FakeInThread,  # noqa: F811
                bot: str,  # noqa: F811
                tmp_path: Path, postgres_server: PostgresForTests,
                db_name: str) -> Iterator[Stack]:  # fmt: skip
    env = telegram_env(db_settings.url, tier_l_temporal, telegram, bot, tmp_path / "blobs")
    try:
        with Stack(env, tmp_path, tier="L", watch=(tier_l_server.log_path,)) as running:
            Owner(running.ingress_url).apply_and_start(SPEC, NAME)
            yield running
    finally:
        cleanup_restore_leftovers(postgres_server, db_name)
        for database in (tier_l_server.database, tier_l_server.visibility_database):
            cleanup_restore_leftovers(postgres_server, database)
        tier_l_server.start(TIER_L_START_S)  # for the session's next tier L test, if stopped


@pytest.fixture
def backups(db_settings: DatabaseSettings, tier_l_server: TemporalServer,
            tier_l_temporal: TemporalSettings, tmp_path: Path) -> BackupSettings:  # fmt: skip
    """The app database and the server's two, as `eventosctl backup` on a TIER=L instance."""
    base = settings_for(db_settings.url, f"file://{tmp_path / 'backups'}",
                        temporal=tier_l_temporal)  # fmt: skip
    server_url = tier_l_server.database_url
    databases = (
        *base.databases,
        BackupTarget(TEMPORAL_DATABASE, with_database(server_url, tier_l_server.database)),
        BackupTarget(
            VISIBILITY_DATABASE, with_database(server_url, tier_l_server.visibility_database)
        ),
    )
    return BackupSettings(**{**base.__dict__, "databases": databases, "rearm_wait_s": 60.0})


def alarm(url: str) -> dict[str, object]:
    found = rows(url, "SELECT id, status FROM alarms")
    assert len(found) == 1, found
    return found[0]


def alarm_inputs(url: str) -> list[dict[str, object]]:
    return rows(url, "SELECT i.status AS ingress, d.status AS delivery FROM bus_ingress i "
                     "LEFT JOIN bus_deliveries d ON d.ingress_id = i.id "
                     "WHERE i.source_key = %(s)s", {"s": f"alarm:{NAME}"})  # fmt: skip


async def status_of(temporal: TemporalSettings, workflow_id: str) -> str:
    """A workflow's status on Temporal by its id (its latest run), or `missing`; and whether
    visibility lists it too (`…+listed`)."""
    client = await Client.connect(temporal.address, namespace=temporal.namespace)
    try:
        found = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return "missing"
    listed = [w async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    status = found.status.name if found.status else "?"
    return f"{status}+listed" if listed else status


async def delete_workflow(temporal: TemporalSettings, workflow_id: str) -> None:
    client = await Client.connect(temporal.address, namespace=temporal.namespace)
    request = DeleteWorkflowExecutionRequest(
        namespace=temporal.namespace, workflow_execution=WorkflowExecution(workflow_id=workflow_id)
    )
    await client.workflow_service.delete_workflow_execution(request)


async def supervised_view(temporal: TemporalSettings) -> tuple[bool, bool]:
    """Whether the supervisor runs and the cron Schedule exists."""
    client = await Client.connect(temporal.address, namespace=temporal.namespace)
    sup = await client.get_workflow_handle(names.supervisor_id(NAME, 1)).describe()
    running = sup.status == WorkflowExecutionStatus.RUNNING
    try:
        await client.get_schedule_handle(names.schedule_id(NAME, 1, "nightly")).describe()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return running, False
    return running, True


def test_the_tier_l_restore_drill_brings_back_the_databases_and_temporal_and_sends_nothing_twice(
    drill_stack: Stack, telegram: FakeInThread, bot: str,  # noqa: F811
    db_settings: DatabaseSettings,
    backups: BackupSettings, tier_l_server: TemporalServer, tier_l_temporal: TemporalSettings,
) -> None:  # fmt: skip
    url, stack, temporal = db_settings.url, drill_stack, tier_l_temporal
    tg, fake = telegram, telegram.fake

    def sent(chat: int) -> int:
        return len(tg.call(fake.sent, bot, chat))

    def turns() -> set[str]:
        return {str(r["id"]) for r in rows(url, "SELECT id FROM turns")}

    owner = Owner(stack.ingress_url)
    until(lambda: account_up(url), 60, "the account read", stack)
    call = f"call: set_alarm {json.dumps({'text': 'wake', 'in_s': ALARM_IN_S})}"
    message = owner.chat(NAME, f"remind me\n{call}")
    until(lambda: owner.message(NAME, message)["reply"] is not None, 90, "the alarm set", stack)
    acknowledged = answered_then_running(tg, bot, url, stack, BEFORE, RUNNING)
    orphans = [str(r["id"]) for r in rows(url, "SELECT id FROM turns WHERE status = 'running'")]
    answered_turn = str(one(url, "SELECT turn_id FROM chat_messages WHERE id = %(m)s",
                            {"m": message}))  # fmt: skip
    at_backup = turns()
    assert alarm(url)["status"] == "scheduled"

    backup = run_async(take_backup(backups, reason="tier L drill"))
    assert [d.name for d in backup.databases] == ["app", "temporal", "temporal_visibility"]

    until(lambda: all(sent(c) == 1 for c in RUNNING), 120, "the slow turns' replies", stack)
    tg.call(fake.customer_message, bot, AFTER, "written after the backup")
    until(lambda: sent(AFTER) == 1 and all_consumed(url), 120, "the last customer answered",
          stack)  # fmt: skip
    (later_turn,) = turns() - at_backup
    # A workflow of the backup's time gone from Temporal: only its databases can bring it back.
    run_async(delete_workflow(temporal, answered_turn))
    until(lambda: run_async(status_of(temporal, answered_turn)) == "missing", 60,
          "the answered turn's workflow deleted", stack)  # fmt: skip
    sends = one(url, "SELECT count(*) FROM outbound_messages WHERE status = 'sent'")
    assert sends == 6  # five customers' replies and the owner's

    # While the server runs, a restore of its databases is refused before anything is touched.
    with pytest.raises(RestoreRefused, match="stop the Temporal server"):
        run_async(restore_backup(backups, backup.id))
    assert one(url, "SELECT count(*) FROM outbound_messages WHERE status = 'sent'") == sends
    assert later_turn in turns()  # still the live database, not the backup's

    server = ServerControl(tier_l_server)
    report = run_async(restore_backup(backups, backup.id, temporal_server=server))
    assert server.starting is not None
    server.starting.join(TIER_L_START_S)
    assert server.stops == 1 and tier_l_server.running()
    assert report.databases == ("app", "temporal", "temporal_visibility")

    # Every message acknowledged before the backup is consumed, once.
    until(lambda: all_consumed(url) and all(sent(c) == 1 for c in RUNNING) and one(
              url, "SELECT count(*) FROM turns WHERE status = 'running'") == 0, 180,
          "every message acknowledged before the backup consumed", stack)  # fmt: skip
    assert updates_in_inbox(url) == acknowledged
    deliveries = rows(url, "SELECT d.ingress_id, d.status FROM bus_deliveries d JOIN bus_ingress i "
                           "ON i.id = d.ingress_id WHERE i.source_key = %(s)s",
                      {"s": f"telegram:{ACCOUNT}"})  # fmt: skip
    assert len(deliveries) == 4 and {d["status"] for d in deliveries} == {"done"}
    until(lambda: one(url, "SELECT count(*) FROM outbound_messages WHERE status IN "
                           "('queued', 'sending')") == 0, 60, "every reply settled", stack)  # fmt: skip
    assert {r["status"] for r in rows(url, "SELECT status FROM outbound_messages")} == {"sent"}
    # Nothing sent twice: the turns that ran again found their replies' keys sent.
    chats = (*BEFORE, *RUNNING, AFTER)
    assert {c: sent(c) for c in chats} == dict.fromkeys(chats, 1)
    # The orphaned turns failed in the database, and their restored runs ended on Temporal.
    assert report.reconcile.turns_failed == 2
    failed = rows(url, "SELECT id, status FROM turns WHERE id = ANY(%(ids)s)", {"ids": orphans})
    assert {r["status"] for r in failed} == {"failed"}, failed
    for turn in orphans:
        assert not run_async(status_of(temporal, turn)).startswith("RUNNING"), turn
    assert report.reconcile.runs_terminated > 0
    assert report.reconcile.sends_kept >= 3
    assert report.reconcile.rearm.startswith("applied"), report.reconcile.rearm
    # Temporal's histories are the backup's: the deleted workflow is back, the later one gone.
    assert run_async(status_of(temporal, answered_turn)) == "COMPLETED+listed"
    assert run_async(status_of(temporal, later_turn)) == "missing"
    # Re-armed: the supervisor runs, the Schedule is there, the alarm fires once.
    until(lambda: run_async(supervised_view(temporal)) == (True, True), 60,
          "the supervisor running and the cron Schedule there again", stack)  # fmt: skip
    fired_once = [{"ingress": "routed", "delivery": "done"}]
    until(lambda: alarm(url)["status"] == "fired" and alarm_inputs(url) == fired_once,
          ALARM_IN_S + 120, "the alarm fired after the restore, and consumed", stack)  # fmt: skip
    # The instance goes on: a new customer is answered after the restore.
    tg.call(fake.customer_message, bot, 8006, "hello after the restore")
    until(lambda: sent(8006) == 1 and all_consumed(url), 120, "a new customer answered", stack)
