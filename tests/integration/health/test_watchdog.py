"""The turn watchdogs (SPEC §12) with a clock the test controls: slow-turn alerts per class, not
counting time without a slot, the stuck-turn item (no step progress for 10 minutes) and the
24-hour backstop that cancels a turn."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from test_router import query
from test_turns import (  # noqa: F401 (`instance` is a fixture)
    Instance,
    instance,
    step_started,
)

from eventos import names
from eventos.health import watchdogs
from eventos.health.loop import supervise_once
from eventos.health.turn_watchdog import watch_once
from eventos.settings import SupervisionSettings
from eventos.testing import wait_for


async def sleeping_turn(instance: Instance) -> dict[str, Any]:
    """An owner turn whose LLM step sleeps (the local provider's script)."""
    await instance.chat("take your time\nsleep: 60")

    async def running() -> dict[str, Any] | None:
        q = "SELECT id, class, started_at FROM turns WHERE employee = %s AND status = 'running'"
        rows = await query(instance.pool, q, instance.name)
        return rows[0] if rows else None

    turn = await wait_for(running, timeout=15, what="the turn running")
    await step_started(instance, turn["id"])
    return turn


async def test_a_slow_turn_is_reported_once_and_held_time_does_not_count(
    instance: Instance,
) -> None:
    turn = await sleeping_turn(instance)
    assert turn["class"] == names.C1_OWNER  # threshold 15 minutes
    at = turn["started_at"] + timedelta(minutes=16)
    async with instance.pool.connection() as conn:  # 10 of those minutes held no slot
        await conn.execute("UPDATE turns SET held_s = 600 WHERE id = %s", (turn["id"],))
    assert (await watch_once(instance.pool, instance.client, at)).slow == []
    async with instance.pool.connection() as conn:
        await conn.execute("UPDATE turns SET held_s = 0 WHERE id = %s", (turn["id"],))
    assert (await watch_once(instance.pool, instance.client, at)).slow == [turn["id"]]
    assert (await watch_once(instance.pool, instance.client, at)).slow == []  # once per turn
    items = await query(instance.pool, "SELECT kind, ref, severity FROM attention_items")
    assert items == [{"kind": names.ATTENTION_SLOW_TURN, "ref": turn["id"], "severity": "warning"}]


async def test_a_turn_without_a_completed_step_for_24_hours_is_cancelled(
    instance: Instance,
) -> None:
    turn = await sleeping_turn(instance)
    later = turn["started_at"] + timedelta(hours=23)
    assert (await watch_once(instance.pool, instance.client, later)).cancelled == []
    day = turn["started_at"] + timedelta(hours=24, minutes=1)
    done = await watch_once(instance.pool, instance.client, day)
    assert done.cancelled == [turn["id"]]

    async def ended() -> str | None:
        rows = await query(instance.pool, "SELECT status FROM turns WHERE id = %s", turn["id"])
        return rows[0]["status"] if rows[0]["status"] != "running" else None

    assert await wait_for(ended, timeout=30, what="the turn cancelled") == names.TURN_CANCELLED

    async def slot_back() -> bool:  # (its input stays pending: the next turn may hold a slot)
        q = "SELECT 1 FROM sched_leases WHERE turn_id = %s"
        return await query(instance.pool, q, turn["id"]) == []

    await wait_for(slot_back, timeout=10, what="the cancelled turn's slot given back")
    # Gone from the running turns: a later pass does nothing more to it.
    again = await watch_once(instance.pool, instance.client, day + timedelta(minutes=5))
    assert turn["id"] not in again.cancelled + again.terminated


async def test_a_turn_without_step_progress_is_a_stuck_turn_until_it_ends(
    instance: Instance,
) -> None:
    await instance.chat("think it over\nsleep: 4")

    async def running() -> dict[str, Any] | None:
        q = "SELECT id, started_at FROM turns WHERE employee = %s AND status = 'running'"
        rows = await query(instance.pool, q, instance.name)
        return rows[0] if rows else None

    turn = await wait_for(running, timeout=15, what="the turn running")
    await step_started(instance, turn["id"])
    cfg = SupervisionSettings()  # stuck after 10 minutes without step progress
    quiet = turn["started_at"] + timedelta(minutes=9)
    done = await supervise_once(instance.pool, None, cfg, now=quiet)
    assert done.watched.open[names.ATTENTION_STUCK_TURN] == []
    stuck = turn["started_at"] + timedelta(minutes=11)
    async with instance.pool.connection() as conn:  # a suspended turn holds no slot
        await conn.execute("UPDATE sched_leases SET state = 'suspended' WHERE turn_id = %s",
                           (turn["id"],))  # fmt: skip
        assert (await watchdogs.stuck_turns(conn, cfg, stuck)) == []
        await conn.execute("UPDATE sched_leases SET state = 'active' WHERE turn_id = %s",
                           (turn["id"],))  # fmt: skip
    done = await supervise_once(instance.pool, None, cfg, now=stuck)
    assert done.watched.open[names.ATTENTION_STUCK_TURN] == [turn["id"]]
    q = "SELECT employee, ref, severity, state, detail FROM attention_items WHERE kind = %s"
    (item,) = await query(instance.pool, q, names.ATTENTION_STUCK_TURN)
    assert (item["employee"], item["ref"], item["severity"], item["state"]) == (
        instance.name, turn["id"], "warning", "open")  # fmt: skip
    assert "no step progress for 11 minutes" in item["detail"]

    async def ended() -> bool:
        q = "SELECT status FROM turns WHERE id = %s"
        return (await query(instance.pool, q, turn["id"]))[0]["status"] != "running"

    await wait_for(ended, timeout=30, what="the turn ended")
    await supervise_once(instance.pool, None, cfg, now=stuck)
    (item,) = await query(instance.pool, q, names.ATTENTION_STUCK_TURN)
    assert item["state"] == "resolved"
