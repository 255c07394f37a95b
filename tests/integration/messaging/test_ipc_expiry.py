# ruff: noqa: F811  (shares test_messaging_turns' `pair` fixture by importing it)
"""SPEC §15 on the real dev server and PostgreSQL: a message or task between employees that
waits undelivered past its bound (24 h; the rows are back-dated, no test waits a day) expires,
and its sender is told in the conversation that sent it."""

from __future__ import annotations

from datetime import UTC, datetime

from test_messaging_turns import Team, pair, script  # noqa: F401 (`pair` is a fixture)
from test_router import query
from test_turns import transcript

from eventos import names
from eventos.messaging import staleness
from eventos.testing import wait_for

BOUND_S = names.IPC_STALE_AFTER_S


async def test_a_message_and_a_task_held_past_24_h_expire_and_their_sender_is_told(
    pair: Team,
) -> None:
    a, b = pair.a, pair.b
    # B is degraded (SPEC §12): the relay holds its background and internal (C3) inputs.
    await query(pair.pool, "INSERT INTO employee_health (employee, degraded_since, reason) "
                "VALUES (%s, now(), 'test') RETURNING 1", b)  # fmt: skip
    calls = "\n".join([script("send_to_employee", to=b, text="the apples are ripe"),
                       script("delegate_to_employee", to=b, task="count the apples")])  # fmt: skip
    await pair.chat(a, calls)
    await pair.replies(a, 1)
    waiting = """SELECT d.id, d.type, d.status, d.reason FROM bus_deliveries d
                 JOIN bus_streams s USING (stream_key) WHERE s.employee = %s ORDER BY d.seq"""

    async def held() -> list[dict[str, object]] | None:
        rows = await query(pair.pool, waiting, b)
        return rows if len(rows) == 2 else None

    rows = await wait_for(held, timeout=30, what="both wakes routed to b and held")
    assert {r["status"] for r in rows} == {"pending"}
    async with pair.pool.connection() as conn:
        # Not yet past the bound: nothing expires.
        assert await staleness.expire_undelivered(conn, datetime.now(UTC), BOUND_S) == 0
        await conn.execute("UPDATE bus_deliveries SET ingress_received_at = ingress_received_at "
                           "- interval '25 hours' WHERE id = ANY(%s)",
                           ([r["id"] for r in rows],))  # fmt: skip
        await conn.commit()
        # The router's messaging upkeep, as its loop runs it.
        assert await staleness.expire_undelivered(conn, datetime.now(UTC), BOUND_S) == 2
    expired = await query(pair.pool, waiting, b)
    assert [(r["type"], r["status"], r["reason"]) for r in expired] == [
        (names.TYPE_IPC_MESSAGE, "expired", "stale: undelivered for 24 h"),
        (names.TYPE_IPC_TASK, "expired", "stale: undelivered for 24 h"),
    ]  # fmt: skip
    (task,) = await query(pair.pool, "SELECT id, status, result FROM ipc_tasks")
    assert (task["status"], task["result"]) == ("expired", "undelivered for 24 h")

    # A is told, in the owner chat that sent them: its next turn reads both notices.
    async def told() -> list[str] | None:
        users = [str(m["content"]) for m in await transcript(pair.pool, "main", a)
                 if m["role"] == "user"]  # fmt: skip
        notices = [u for u in users if "expired" in u]
        return notices if len(notices) == 2 else None

    notices = await wait_for(told, timeout=45, what="a's turn read both notices")
    assert any(f"to {b} expired undelivered after 24 h" in n and "the apples are ripe" in n
               for n in notices)  # fmt: skip
    assert any(f"[task {task['id']} for {b} expired: undelivered for 24 h" in n for n in notices)
    turns = await query(pair.pool, "SELECT stream_key FROM turns WHERE employee = %s", a)
    assert {t["stream_key"] for t in turns} == {f"{a}/g1/talk/main"}
    assert await query(pair.pool, "SELECT 1 FROM turns WHERE employee = %s", b) == []
