"""EG11 on the real stack (SPEC §9, §16): past 80% background inputs are held while chats
run; at 100% the employee pauses with a notice and the running turn suspends; at the end of
its period (moved by the test: the period's end is data, the supervisor's timer follows it)
it resumes, the held inputs run in (class, seq) order and the suspended turn finishes."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from psycopg_pool import AsyncConnectionPool
from test_router import append_all, driver_event, query
from test_supervision import applied, new_employee
from test_turns import Instance, instance, local_spec  # noqa: F401 (`instance` is a fixture)

from eventos import names
from eventos.db import Conn
from eventos.scheduling import ledger
from eventos.testing import wait_for


def budgeted(name: str) -> str:
    """Owner chat, an internal driver (C3) and a background driver (C4), $1 a day."""
    return local_spec(
        name,
        f"""    - {{kind: chat}}
    - {{kind: grpc, name: ops, driver: ops-{name}, class: C3}}
    - {{kind: grpc, name: bg, driver: bg-{name}, class: C4}}
  budget: {{daily_usd: 1}}
""",
    )


async def chat(instance: Instance, name: str, text: str) -> int:
    body = {"client_message_id": uuid.uuid4().hex, "text": text}
    r = await instance.api.post(f"/v1/employees/{name}/chat", json=body)
    assert r.status_code == 202, r.text
    return int(r.json()["message_id"])


async def set_spent(pool: AsyncConnectionPool[Conn], name: str, usd: str) -> None:
    """Spending so far today (the ledger's row for the current period)."""
    async with pool.connection() as conn:
        await conn.execute("UPDATE employee_spend SET spent_usd = %s WHERE employee = %s",
                           (Decimal(usd), name))  # fmt: skip


async def one(pool: AsyncConnectionPool[Conn], q: str, *args: object) -> dict[str, Any] | None:
    rows = await query(pool, q, *args)
    return rows[0] if rows else None


async def test_eg11_budget_high_max_and_the_period_end(instance: Instance) -> None:
    pool, name = instance.pool, await new_employee(instance, budgeted)
    await applied(instance, name, "start")
    async with pool.connection() as conn:
        await ledger.refresh(conn, name)  # the budget's row and the period's spend row
    await set_spent(pool, name, "0.795")

    # A chat step reserves ~0.01 USD (max_tokens 1024 at 10 USD/Mtok): 80.5%, `high`.
    first = await chat(instance, name, "first")
    assert "first" in await instance.reply(first, name=name)
    budget = await one(pool, "SELECT state FROM employee_budgets WHERE employee = %s", name)
    assert budget == {"state": names.BUDGET_HIGH}

    # Background inputs are held (C4 first, then C3); chats still run.
    await append_all(pool, [driver_event("x", 1, f"grpc:bg-{name}", text="background")])
    await append_all(pool, [driver_event("x", 2, f"grpc:ops-{name}", text="internal")])

    async def held() -> bool:
        q = "SELECT 1 FROM bus_streams WHERE employee = %s AND hold_reason = 'budget'"
        return bool(await query(pool, q, name))

    await wait_for(held, timeout=15, what="the background stream held for the budget")
    second = await chat(instance, name, "second")
    assert "second" in await instance.reply(second, name=name)
    turns_by_class = "SELECT class FROM turns WHERE employee = %s ORDER BY started_at"
    assert [t["class"] for t in await query(pool, turns_by_class, name)] == [1, 1]

    # A reservation past 100%: the turn suspends, the employee pauses with a notice.
    await set_spent(pool, name, "0.995")
    third = await chat(instance, name, "third")

    async def paused() -> tuple[object, ...] | None:
        q = "SELECT state, pause_reason FROM generations WHERE employee = %s"
        gen = await one(pool, q, name)
        leases = await query(pool, "SELECT state FROM sched_leases WHERE employee = %s", name)
        if gen == {"state": "paused", "pause_reason": "budget"} and leases == [
            {"state": "suspended"}
        ]:
            return (gen, leases)
        return None

    await wait_for(paused, timeout=20, what="paused for the budget, the turn suspended")
    notice = await one(pool, "SELECT text FROM chat_events WHERE employee = %s AND kind = "
                       "'notice'", name)  # fmt: skip
    assert notice is not None and "daily budget of 1.00 USD" in notice["text"]
    intent = "SELECT state FROM intents WHERE employee = %s AND kind = 'stop'"
    await wait_for(lambda: _is(pool, intent, name, {"state": "applied"}), timeout=15,
                   what="the budget pause applied by the supervisor")  # fmt: skip

    # "Midnight": the period ends in 2 s; the supervisor re-reads its deadline and fires.
    async with pool.connection() as conn:
        await conn.execute("UPDATE employee_budgets SET period_end = now() + interval '2 s' "
                           "WHERE employee = %s", (name,))  # fmt: skip
    supervisor = instance.client.get_workflow_handle(names.supervisor_id(name, 1))
    await supervisor.signal(names.SIGNAL_BUDGET_CHANGED)

    assert "third" in await instance.reply(third, timeout=60, name=name)

    async def all_ran() -> list[int] | None:
        q = "SELECT class FROM turns WHERE employee = %s AND status = 'done' ORDER BY started_at"
        rows = await query(pool, q, name)
        classes = [int(r["class"]) for r in rows]
        return classes if len(classes) == 5 else None

    # The held inputs run in (class, seq) order: C3 before the C4 that came first.
    assert await wait_for(all_ran, timeout=60, what="every turn done") == [1, 1, 1, 3, 4]
    gen = await one(pool, "SELECT state FROM generations WHERE employee = %s", name)
    assert gen == {"state": names.GEN_RUNNING}
    budget = await one(pool, "SELECT state FROM employee_budgets WHERE employee = %s", name)
    assert budget == {"state": names.BUDGET_NORMAL}
    items = await query(pool, "SELECT kind FROM attention_items WHERE employee = %s AND "
                        "state = 'open'", name)  # fmt: skip
    assert items == []


async def _is(pool: AsyncConnectionPool[Conn], q: str, name: str, want: dict[str, Any]) -> bool:
    return await one(pool, q, name) == want
