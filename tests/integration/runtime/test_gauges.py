"""The figures that live in the database, as the relay's and egress's periodic reads set them
(SPEC §12): oldest open delivery and held inputs per class, open edge breakers, outbox depth."""

from __future__ import annotations

import uuid

from metrics_table import sample
from psycopg_pool import AsyncConnectionPool
from test_relay import employee  # noqa: F401  (a fixture, shared)
from test_router import append_all, driver_event, route_until_done

from eventos import names
from eventos.db import Conn
from eventos.employees import lifecycle
from eventos.runtime.gauges import read_backlog, read_outbox
from eventos.runtime.metrics import BREAKERS_OPEN, EGRESS_DEPTH, PENDING_HELD, PENDING_OLDEST_AGE

C3 = f"c{names.C3_INTERNAL}"


async def test_open_deliveries_held_ones_and_edge_breakers(
    employee: str,  # noqa: F811
    pool: AsyncConnectionPool[Conn],
) -> None:
    await read_backlog(pool)
    assert sample(PENDING_OLDEST_AGE, "", llm_class=C3) == 0  # nothing open yet
    await append_all(pool, [driver_event("ida", n) for n in range(3)])
    await route_until_done(pool)
    async with pool.connection() as conn:  # written a minute ago, by the database's clock
        await conn.execute("UPDATE bus_deliveries SET created_at = now() - interval '60 s'")
        await conn.execute(
            "INSERT INTO storm_edges (sender, target, tokens, updated_at, breaker, opened_at) "
            "VALUES ('a', 'b', 0, now(), 'open', now()), ('b', 'c', 0, now(), 'half_open', now())"
        )
    await read_backlog(pool)
    assert 60 <= sample(PENDING_OLDEST_AGE, "", llm_class=C3) < 600
    assert sample(PENDING_HELD, "", llm_class=C3, hold=names.HOLD_PAUSED) == 0
    assert sample(BREAKERS_OPEN, "", breaker="employee_edge") == 1  # half open is probing
    async with pool.connection() as conn:
        await lifecycle.stop(conn, employee)  # its streams are held `paused`
    await read_backlog(pool)
    assert sample(PENDING_HELD, "", llm_class=C3, hold=names.HOLD_PAUSED) == 3
    async with pool.connection() as conn:
        await lifecycle.resume(conn, employee)
    await read_backlog(pool)  # a hold that cleared reads 0, not its last count
    assert sample(PENDING_HELD, "", llm_class=C3, hold=names.HOLD_PAUSED) == 0


async def test_outbox_depth_by_status(pool: AsyncConnectionPool[Conn]) -> None:
    async with pool.connection() as conn:
        for status in ("queued", "queued", "sending", "held", "sent"):
            await conn.execute(
                "INSERT INTO outbound_messages (idempotency_key, employee, thread, turn_id, kind,"
                " class, status) VALUES (%s, 'e', 't', 'turn', 'chat', 1, %s)",
                (uuid.uuid4().hex, status),
            )
    await read_outbox(pool)
    assert sample(EGRESS_DEPTH, "", status="queued") == 2
    assert sample(EGRESS_DEPTH, "", status="sending") == 1
    assert sample(EGRESS_DEPTH, "", status="held") == 0  # not egress's until approved
