"""The router service's owner lane (issue 27): the owner's rows never wait for a pass over
background sources."""

from __future__ import annotations

import uuid
from pathlib import Path

from conftest import run_service
from eventos_router.app import RouterConfig
from eventos_router.app import build as build_router
from psycopg_pool import AsyncConnectionPool
from test_router import append_all, driver_event, route_until_done

from eventos import names
from eventos.db import Conn
from eventos.owner import chat
from eventos.settings import DatabaseSettings, ServiceSettings
from eventos.testing import wait_for


async def test_the_owners_message_is_routed_while_a_background_pass_waits(
    started: str, pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path
) -> None:
    """A background pass blocks on its stream's row (locked by another transaction); the
    owner's message, accepted meanwhile, is routed and committed all the same (one pass over
    every source held it in the blocked transaction)."""
    await append_all(pool, [driver_event("bg", 0)])
    await route_until_done(pool)  # the background stream's row exists
    talk = "SELECT count(*) AS n FROM bus_deliveries d JOIN bus_streams s USING (stream_key)"
    talk += " WHERE s.lane = %s"
    async with pool.connection() as locker, locker.transaction():
        await locker.execute("SELECT 1 FROM bus_streams WHERE lane = %s FOR UPDATE",
                             (names.LANE_WORKER,))  # fmt: skip
        await append_all(pool, [driver_event("bg", 1)])
        async with pool.connection() as conn:
            await chat.send(conn, started, uuid.uuid4().hex, "me, now")
        router = await build_router(RouterConfig(db_settings, ServiceSettings("router")))
        task = await run_service(router)
        try:

            async def routed() -> bool:
                async with pool.connection() as conn:
                    cur = await conn.execute(talk, (names.LANE_TALK,))
                    return int((await cur.fetchone() or {})["n"]) > 0

            await wait_for(routed, timeout=10, what="the owner's message routed")
        finally:
            router.stop()
            await task
