# ruff: noqa: F811  (shares test_turns' `instance` fixture by importing it)
"""Cron ticks under SPEC §10 and §15 on the real dev server and PostgreSQL: one pending tick
per schedule while a hold keeps them, or while the relay holds them for a conversation waiting
for a slot (the newest wins; one older than an interval expires), and the `on_busy` rules
`queue` and `merge` for a tick arriving while its trigger's turn runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import ScheduleBackfill, ScheduleHandle, ScheduleOverlapPolicy
from test_budget import chat, set_spent
from test_router import query
from test_supervision import applied, described, new_employee
from test_turns import Instance, instance, local_spec  # noqa: F401 (`instance` is a fixture)
from test_waiting import fill, gate_of

from eventos import names
from eventos.runtime.temporal import wake_entities
from eventos.scheduling import admission, ledger
from eventos.scheduling.policy import SchedConfig
from eventos.testing import wait_for

HOUR = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
SLOW = "hourly chore\\nsleep: 3\\ncall: lookup {}"
SUPERSEDED = "superseded: a newer tick of its schedule came"
STALE = "stale: pending longer than one interval of its schedule (3600 s)"


def hourly(on_busy: str = "skip", text: str = SLOW, extra: str = "") -> Any:
    def spec(name: str) -> str:
        return local_spec(name, f"""    - {{kind: chat}}
    - {{kind: cron, name: hourly, schedule: "0 * * * *", on_busy: {on_busy}, text: "{text}"}}
{extra}""")  # fmt: skip

    return spec


async def schedule_of(instance: Instance, name: str) -> ScheduleHandle:
    schedule = instance.client.get_schedule_handle(names.schedule_id(name, 1, "hourly"))
    await wait_for(lambda: described(schedule), timeout=30, what="the Schedule created")
    return schedule


async def fire(schedule: ScheduleHandle, at: datetime) -> None:
    """The schedule's action for the nominal time `at` (a backfill of that hour)."""
    window = ScheduleBackfill(at - timedelta(minutes=1), at + timedelta(minutes=1),
                              overlap=ScheduleOverlapPolicy.ALLOW_ALL)  # fmt: skip
    await schedule.backfill(window)


async def fire_routed(instance: Instance, name: str, schedule: ScheduleHandle, hours: int) -> None:
    """Tick `hours` before this hour, once routed: the test's tick number 4 - `hours`."""
    await fire(schedule, HOUR - timedelta(hours=hours))

    async def routed() -> list[dict[str, Any]] | None:
        rows = await ticks(instance, name)
        return rows if len(rows) == 4 - hours else None

    await wait_for(routed, timeout=20, what=f"tick {4 - hours} routed")


async def ticks(instance: Instance, name: str) -> list[dict[str, Any]]:
    q = """SELECT d.seq, d.status, d.reason, d.payload -> 'data' ->> 'every_s' AS every_s
           FROM bus_deliveries d JOIN bus_streams s USING (stream_key)
           WHERE s.employee = %s AND d.type = %s ORDER BY d.seq"""
    return await query(instance.pool, q, name, names.TYPE_TRIGGER_CRON)


async def older_than_an_hour(instance: Instance, name: str, seq: int) -> None:
    """Back-date a tick by 61 minutes (no test waits an hour)."""
    await query(instance.pool, "UPDATE bus_deliveries SET ingress_received_at = "
                "ingress_received_at - interval '61 minutes' WHERE stream_key IN (SELECT "
                "stream_key FROM bus_streams WHERE employee = %s) AND seq = %s RETURNING 1",
                name, seq)  # fmt: skip


async def cron_turns(instance: Instance, name: str) -> list[dict[str, Any]]:
    q = "SELECT id, status, consumed_seq FROM turns WHERE employee = %s AND class = 4 ORDER BY n"
    return await query(instance.pool, q, name)


async def test_ticks_held_by_the_budget_keep_the_newest_and_expire_one_older_than_an_interval(
    instance: Instance,
) -> None:
    name = await new_employee(
        instance, hourly(text="hourly chore", extra="  budget: {daily_usd: 1}\n")
    )
    await applied(instance, name, "start")
    schedule = await schedule_of(instance, name)
    async with instance.pool.connection() as conn:
        await ledger.refresh(conn, name)
    await set_spent(instance.pool, name, "0.795")
    await instance.reply(await chat(instance, name, "first"), name=name)  # past 80%: `high`

    for hours in (3, 2, 1):  # three ticks while background work is held
        await fire_routed(instance, name, schedule, hours)
    rows = await ticks(instance, name)
    assert [(r["status"], r["reason"]) for r in rows] == [
        ("expired", SUPERSEDED), ("expired", SUPERSEDED), ("pending", None),
    ]  # fmt: skip
    assert {float(r["every_s"]) for r in rows} == {3600.0}
    # The newest waited longer than one interval …
    await older_than_an_hour(instance, name, rows[-1]["seq"])
    # … when the budget's period ends and the hold lifts: it expires instead of running.
    await query(instance.pool, "UPDATE employee_budgets SET period_end = now() + interval '1 s' "
                "WHERE employee = %s RETURNING 1", name)  # fmt: skip
    supervisor = instance.client.get_workflow_handle(names.supervisor_id(name, 1))
    await supervisor.signal(names.SIGNAL_BUDGET_CHANGED)

    async def stale() -> dict[str, Any] | None:
        last = (await ticks(instance, name))[-1]
        return last if last["status"] != "pending" else None

    last = await wait_for(stale, timeout=30, what="the stale tick settled")
    assert (last["status"], last["reason"]) == ("expired", STALE)
    # A fresh tick after the hold runs as before.
    await fire(schedule, HOUR)

    async def ran() -> list[dict[str, Any]] | None:
        turns = await cron_turns(instance, name)
        return turns if turns and turns[-1]["status"] == names.TURN_DONE else None

    assert len(await wait_for(ran, timeout=30, what="the fresh tick's turn done")) == 1
    assert [r["status"] for r in await ticks(instance, name)] == ["expired"] * 3 + ["done"]
    kinds = await query(instance.pool, "SELECT detail ->> 'reason' AS reason FROM employee_timeline "
                        "WHERE employee = %s AND kind = 'input.expired'", name)  # fmt: skip
    assert sorted(k["reason"] for k in kinds) == ["stale", "superseded", "superseded"]


async def test_ticks_held_for_a_waiting_conversation_expire_when_its_slot_comes(
    instance: Instance,
) -> None:
    """A conversation queued for a C4 slot is sent no tick meanwhile (the relay holds them for
    its grant): a newer tick supersedes a held one, and the grant expires one pending longer
    than an interval instead of handing it over, as the relay would before sending it."""
    held = await fill(instance.pool, names.C4_BACKGROUND, 1)
    name = await new_employee(instance, hourly(text="hourly chore"))
    await applied(instance, name, "start")
    schedule = await schedule_of(instance, name)
    await fire(schedule, HOUR - timedelta(hours=3))
    await gate_of(instance.api, name, "class_slot", status="delivered")  # queued for a slot
    for hours in (2, 1):
        await fire_routed(instance, name, schedule, hours)
    rows = await ticks(instance, name)
    assert [(r["status"], r["reason"]) for r in rows] == [
        ("delivered", None), ("expired", SUPERSEDED), ("pending", None),
    ]  # fmt: skip
    await older_than_an_hour(instance, name, rows[-1]["seq"])
    async with instance.pool.connection() as conn:
        _, wake = await admission.release(conn, SchedConfig(), held[0], names.TURN_DONE)
    await wake_entities(instance.client, wake)

    async def ran() -> list[dict[str, Any]] | None:
        turns = await cron_turns(instance, name)
        return turns if turns and turns[-1]["status"] == names.TURN_DONE else None

    (turn,) = await wait_for(ran, timeout=30, what="the first tick's turn done")
    assert turn["consumed_seq"] == rows[0]["seq"]  # the first tick alone
    assert [(r["status"], r["reason"]) for r in await ticks(instance, name)] == [
        ("done", None), ("expired", SUPERSEDED), ("expired", STALE),
    ]  # fmt: skip


async def _two_ticks_while_the_first_runs(
    instance: Instance, on_busy: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Fire a slow tick, and the next one while its turn runs; both ticks once settled, and
    the cron turns once all are done."""
    name = await new_employee(instance, hourly(on_busy))
    await applied(instance, name, "start")
    schedule = await schedule_of(instance, name)
    await fire(schedule, HOUR - timedelta(hours=2))

    async def running() -> bool:
        return any(t["status"] == "running" for t in await cron_turns(instance, name))

    await wait_for(running, timeout=20, what="the first tick's turn running")
    await fire(schedule, HOUR - timedelta(hours=1))

    async def settled() -> list[dict[str, Any]] | None:
        rows = await ticks(instance, name)
        turns = await cron_turns(instance, name)
        done = all(r["status"] == "done" for r in rows) and all(
            t["status"] == names.TURN_DONE for t in turns
        )
        return rows if len(rows) == 2 and done else None

    rows = await wait_for(settled, timeout=60, what="both ticks settled")
    return rows, await cron_turns(instance, name)


async def test_on_busy_queue_runs_a_tick_that_came_during_its_triggers_turn_next(
    instance: Instance,
) -> None:
    rows, turns = await _two_ticks_while_the_first_runs(instance, "queue")
    assert [r["reason"] for r in rows] == [None, None]
    assert [t["consumed_seq"] for t in turns] == [1, 2]  # one turn each, one after the other


async def test_on_busy_merge_offers_a_tick_that_came_during_its_triggers_turn_to_that_turn(
    instance: Instance,
) -> None:
    rows, turns = await _two_ticks_while_the_first_runs(instance, "merge")
    assert [r["reason"] for r in rows] == [None, None]
    # The second tick joined the running turn (merge point B1): one turn consumed both.
    assert [t["consumed_seq"] for t in turns] == [2]
    (said,) = await query(instance.pool, "SELECT count(*) AS n FROM transcript_messages WHERE "
                          "turn_id = %s AND message ->> 'role' = 'user'", turns[0]["id"])  # fmt: skip
    assert said["n"] == 2
