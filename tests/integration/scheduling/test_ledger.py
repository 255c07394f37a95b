"""The daily spend ledger on PostgreSQL (SPEC §9): keyed reservations counted once, the
states `normal` → `high` → `max`, the budget pause, and its release by a top-up or the
period's end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from conftest import apply_and_start
from psycopg_pool import AsyncConnectionPool
from test_router import query

from eventos import names
from eventos.db import Conn
from eventos.employees import intents
from eventos.errors import BudgetExceeded, BudgetHeld
from eventos.scheduling import ledger
from eventos.scheduling.ledger import Reservation

SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: spender}
spec:
  timezone: Europe/Berlin
  budget: {daily_usd: 10}
  agents:
    - name: front
      model: {provider: local, name: echo}
  triggers:
    - {kind: chat}
"""


@pytest.fixture
async def spender(pool: AsyncConnectionPool[Conn]) -> str:
    await apply_and_start(pool, SPEC)
    return "spender"


def cost(key: str, usd: str, klass: int = names.C2_CUSTOMER) -> Reservation:
    return Reservation(key, "spender", "turn-spender-1", klass, "local/echo", Decimal(usd))


async def reserve(pool: AsyncConnectionPool[Conn], r: Reservation) -> str:
    async with pool.connection() as conn:
        return await ledger.reserve(conn, r)


async def spend(pool: AsyncConnectionPool[Conn]) -> tuple[Decimal, Decimal]:
    (row,) = await query(pool, "SELECT reserved_usd, spent_usd FROM employee_spend")
    return row["reserved_usd"], row["spent_usd"]


async def test_a_key_counts_once_however_often_it_is_reserved_or_settled(
    pool: AsyncConnectionPool[Conn], spender: str
) -> None:
    assert await reserve(pool, cost("wf:step-0:1", "2")) == names.BUDGET_NORMAL
    assert await reserve(pool, cost("wf:step-0:1", "2")) == names.BUDGET_NORMAL  # a retry
    assert await spend(pool) == (Decimal(2), Decimal(0))
    async with pool.connection() as conn:
        for _ in range(2):
            await ledger.settle(conn, "wf:step-0:1", Decimal("0.5"), 100, 10)
    assert await spend(pool) == (Decimal(0), Decimal("0.5"))
    await reserve(pool, cost("wf:step-0:2", "1"))  # the next attempt is billed on its own
    async with pool.connection() as conn:
        await ledger.settle(conn, "wf:step-0:2", Decimal(0), released=True)
    assert await spend(pool) == (Decimal(0), Decimal("0.5"))
    events = await query(pool, "SELECT key, state FROM spend_events ORDER BY key")
    assert [(e["key"], e["state"]) for e in events] == [("wf:step-0:1", "settled"),
                                                        ("wf:step-0:2", "released")]  # fmt: skip


async def test_past_80_percent_background_work_is_refused(
    pool: AsyncConnectionPool[Conn], spender: str
) -> None:
    assert await reserve(pool, cost("a", "7.9")) == names.BUDGET_NORMAL
    assert await reserve(pool, cost("b", "0.2")) == names.BUDGET_HIGH
    (item,) = await query(pool, "SELECT kind, state FROM attention_items")
    assert (item["kind"], item["state"]) == (names.ATTENTION_BUDGET_HIGH, "open")
    with pytest.raises(BudgetHeld):
        await reserve(pool, cost("c", "0.01", names.C4_BACKGROUND))
    with pytest.raises(BudgetHeld):
        await reserve(pool, cost("d", "0.01", names.C3_INTERNAL))
    assert await reserve(pool, cost("e", "0.01", names.C1_OWNER)) == names.BUDGET_HIGH


async def test_past_100_percent_the_employee_pauses_with_a_notice(
    pool: AsyncConnectionPool[Conn], spender: str
) -> None:
    await reserve(pool, cost("a", "9.5"))
    with pytest.raises(BudgetExceeded):
        await reserve(pool, cost("b", "0.6", names.C1_OWNER))
    (gen,) = await query(pool, "SELECT state, pause_reason FROM generations")
    assert (gen["state"], gen["pause_reason"]) == (names.GEN_PAUSED, names.PAUSE_BUDGET)
    (intent,) = await query(pool, "SELECT kind, payload FROM intents")
    assert intent["kind"] == names.INTENT_STOP
    assert intent["payload"]["pause_reason"] == names.PAUSE_BUDGET
    (notice,) = await query(pool, "SELECT session, text FROM chat_events WHERE kind = 'notice'")
    assert "daily budget of 10.00 USD" in notice["text"] and "--daily-usd" in notice["text"]
    kinds = {r["kind"] for r in await query(pool, "SELECT kind FROM attention_items")}
    assert names.ATTENTION_BUDGET_MAX in kinds
    with pytest.raises(BudgetExceeded):  # paused until the period ends or a top-up
        await reserve(pool, cost("c", "0.01", names.C1_OWNER))
    assert await spend(pool) == (Decimal("9.5"), Decimal(0))  # refused calls reserve nothing


async def test_a_top_up_lifts_the_pause_and_releases_held_work(
    pool: AsyncConnectionPool[Conn], spender: str
) -> None:
    await reserve(pool, cost("a", "9.5"))
    with pytest.raises(BudgetExceeded):
        await reserve(pool, cost("b", "0.6"))
    async with pool.connection() as conn:
        await conn.execute("UPDATE bus_streams SET hold_reason = 'budget'")  # none yet: no-op
        await conn.execute(
            "INSERT INTO sched_leases (turn_id, employee, class, state) VALUES"
            " ('turn-bg', 'spender', 4, 'suspended'), ('turn-chat', 'spender', 1, 'suspended')"
        )
        await intents.set_limits(conn, "spender", {"daily_usd": 11})  # 9.5 is 86%: high
        high = await ledger.refresh(conn, "spender")
    assert high.state == names.BUDGET_HIGH and high.released_turns == ["turn-chat"]
    assert high.resumed is not None and high.resumed.state == names.GEN_RUNNING
    async with pool.connection() as conn:
        await intents.set_limits(conn, "spender", {"daily_usd": 20})
        normal = await ledger.refresh(conn, "spender")
    assert normal.state == names.BUDGET_NORMAL and normal.resumed is None  # already running
    assert sorted(normal.released_turns) == ["turn-bg", "turn-chat"]
    open_items = await query(pool, "SELECT kind FROM attention_items WHERE state = 'open'")
    assert open_items == []


async def test_the_period_end_starts_a_new_period_with_nothing_spent(
    pool: AsyncConnectionPool[Conn], spender: str
) -> None:
    """The period's end is data: moved to just now (a clock the test controls), the next
    reservation or the supervisor's refresh starts a fresh period ending at the owner's next
    midnight plus the offset."""
    await reserve(pool, cost("a", "8.5"))
    end = datetime.now(UTC) - timedelta(seconds=1)
    async with pool.connection() as conn:
        await conn.execute("UPDATE employee_budgets SET period_end = %s", (end,))
        done = await ledger.refresh(conn, "spender")
    assert done.state == names.BUDGET_NORMAL
    assert done.period_end == ledger.period_of("Europe/Berlin", ledger.offset_of("spender"),
                                               datetime.now(UTC))[1]  # fmt: skip
    (budget,) = await query(pool, "SELECT period_start, state FROM employee_budgets")
    assert (budget["period_start"], budget["state"]) == (end, names.BUDGET_NORMAL)
    assert await reserve(pool, cost("b", "1")) == names.BUDGET_NORMAL
    rows = await query(pool, "SELECT reserved_usd FROM employee_spend ORDER BY period_start")
    assert [r["reserved_usd"] for r in rows] == [Decimal("8.5"), Decimal(1)]
