"""The restore drill (issue 29 point 3, RFC-0005 §21.3; docs/backups.md), the six services as
processes with a Telegram bot on its loopback fake: customers write, a backup is taken while two
of their turns run, the turns finish and reply, another customer writes and is answered, and
the backup is restored under the running instance. Every message acknowledged before the backup
is consumed after the restore, and the fake Telegram receives each reply once: the turns that
run again find their replies' keys already sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import E2E_TIMEOUT_S
from fleet_helpers import cleanup_restore_leftovers, settings_for
from stack import Owner, Stack, one, rows, run_async, until
from test_channel_faults import (  # noqa: F401 (telegram, temporal, bot: fixtures)
    NAME,
    SPEC,
    FakeInThread,
    account_up,
    bot,
    telegram,
    telegram_env,
    temporal,
    updates_in_inbox,
)

from eventos.fleet.backups import restore_backup, take_backup
from eventos.local.temporal_dev import TemporalDevServer
from eventos.settings import BackupSettings, DatabaseSettings, TemporalSettings
from eventos.testing.plugin import PostgresForTests

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

BEFORE = (7001, 7002)  # answered before the backup
RUNNING = (7003, 7004)  # their turns run while the backup is taken
AFTER = 7005  # writes after the backup


@pytest.fixture
def drill_stack(db_settings: DatabaseSettings, temporal: TemporalDevServer,
                telegram: FakeInThread, bot: str, tmp_path: Path,
                postgres_server: PostgresForTests, db_name: str) -> Iterator[Stack]:  # fmt: skip
    settings = TemporalSettings(temporal.address, temporal.namespace)
    env = telegram_env(db_settings.url, settings, telegram, bot, tmp_path / "blobs")
    with Stack(env, tmp_path) as running:
        Owner(running.ingress_url).apply_and_start(SPEC, NAME)
        yield running
    cleanup_restore_leftovers(postgres_server, db_name)


@pytest.fixture
def backups(db_settings: DatabaseSettings, temporal: TemporalDevServer,
            tmp_path: Path) -> BackupSettings:  # fmt: skip
    temporal = TemporalSettings(temporal.address, temporal.namespace)
    settings = settings_for(db_settings.url, f"file://{tmp_path / 'backups'}", temporal=temporal)
    return BackupSettings(**{**settings.__dict__, "rearm_wait_s": 60.0})


def all_consumed(url: str) -> bool:
    open_ = one(url, "SELECT count(*) FROM bus_deliveries WHERE status <> 'done'")
    return open_ == 0 and one(url, "SELECT count(*) FROM sched_leases") == 0


def answered_then_running(tg: FakeInThread, bot: str, url: str, stack: Stack,
                          before: tuple[int, ...], running: tuple[int, ...]) -> list[str]:  # fmt: skip
    """The drill's state when its backup is taken: the customers `before` answered, then the
    turns of the customers `running` running (the scripted model takes 8 s over each); the
    updates acknowledged."""
    fake = tg.fake
    for chat in before:
        tg.call(fake.customer_message, bot, chat, f"hello from {chat}")
    until(lambda: all(len(tg.call(fake.sent, bot, c)) == 1 for c in before) and all_consumed(url),
          120, "the first customers answered", stack)  # fmt: skip
    for chat in running:
        tg.call(fake.customer_message, bot, chat, f"a slow one from {chat}\nsleep: 8")
    until(lambda: one(url, "SELECT count(*) FROM turns WHERE status = 'running'") == len(running),
          60, "the slow turns running", stack)  # fmt: skip
    acknowledged = updates_in_inbox(url)
    assert len(acknowledged) == len(before) + len(running)
    return acknowledged


def test_the_restore_drill_consumes_every_acknowledged_message_and_sends_no_reply_twice(
    drill_stack: Stack, telegram: FakeInThread, bot: str,
    db_settings: DatabaseSettings, backups: BackupSettings,
) -> None:  # fmt: skip
    url, tg, fake, bot, stack = (
        db_settings.url,
        telegram,
        telegram.fake,
        bot,
        drill_stack,
    )

    def sent(chat: int) -> int:
        return len(tg.call(fake.sent, bot, chat))

    until(lambda: account_up(url), 30, "the account read", stack)
    acknowledged = answered_then_running(tg, bot, url, stack, BEFORE, RUNNING)

    backup = run_async(take_backup(backups, reason="drill"))

    until(lambda: all(sent(c) == 1 for c in RUNNING), 90, "the slow turns' replies", stack)
    tg.call(fake.customer_message, bot, AFTER, "written after the backup")
    until(lambda: sent(AFTER) == 1 and all_consumed(url), 90, "the last customer answered", stack)
    assert one(url, "SELECT count(*) FROM outbound_messages WHERE status = 'sent'") == 5

    report = run_async(restore_backup(backups, backup.id))

    # The restored database: the four messages acknowledged before the backup, all consumed.
    until(lambda: all_consumed(url) and one(url, "SELECT count(*) FROM turns WHERE "
                                             "status = 'done'") == 4, 120,
          "every message acknowledged before the backup consumed", stack)  # fmt: skip
    assert updates_in_inbox(url) == acknowledged
    deliveries = rows(url, "SELECT ingress_id, status FROM bus_deliveries ORDER BY ingress_id")
    assert len(deliveries) == 4 and {d["status"] for d in deliveries} == {"done"}
    until(lambda: one(url, "SELECT count(*) FROM outbound_messages WHERE status IN "
                           "('queued', 'sending')") == 0, 60, "every reply settled", stack)  # fmt: skip
    assert {r["status"] for r in rows(url, "SELECT status FROM outbound_messages")} == {"sent"}
    # Nothing sent twice: the turns that ran again found their replies' keys sent.
    assert {c: sent(c) for c in (*BEFORE, *RUNNING, AFTER)} == dict.fromkeys(
        (*BEFORE, *RUNNING, AFTER), 1
    )
    # What the restore said it did.
    assert report.reconcile.turns_failed == 2  # the two running at the backup, orphaned
    assert report.reconcile.deliveries_pending == 2
    assert report.reconcile.sends_kept >= 3  # the replies sent since the backup
    assert report.reconcile.runs_terminated > 0
    assert report.reconcile.rearm.startswith("applied"), report.reconcile.rearm
    # The instance goes on: a new customer is answered after the restore.
    tg.call(fake.customer_message, bot, 7006, "hello after the restore")
    until(lambda: sent(7006) == 1 and all_consumed(url), 90, "a new customer answered", stack)
