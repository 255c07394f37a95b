"""egress rides out a lost database (the fault run's finding): its retry loop used to end on
the pool's timeout, which stopped the whole service until its supervision restarted it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from eventos.db import connect, open_pool
from eventos.db.migrate import migrate
from eventos.local.embedded_pg import EmbeddedPostgres
from eventos.outbox.egress import Egress, retry_loop
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.service import cancel_and_wait
from eventos.settings import DatabaseSettings
from eventos.testing import wait_for


async def test_the_retry_loop_waits_out_a_lost_database_and_reads_again(
    tmp_path: Path, outbox_keys: OutboxKeys, caplog: pytest.LogCaptureFixture
) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg", durable=False)
    await asyncio.to_thread(pg.start)
    settings = DatabaseSettings(url=pg.url())
    async with await connect(settings) as conn:
        await migrate(conn)
    pool = await open_pool(settings, autocommit=True)
    loop = asyncio.create_task(retry_loop(Egress(pool, outbox_keys), poll_s=0.1))
    caplog.set_level(logging.WARNING, logger="eventos.outbox.egress")

    def warnings() -> int:
        return sum("egress retries" in r.getMessage() for r in caplog.records)

    try:
        await asyncio.to_thread(pg.stop)
        await wait_for(lambda: _async(warnings() >= 2), timeout=60, what="two failed rounds")
        assert not loop.done(), loop
        await asyncio.to_thread(pg.start)
        pool.pop_stats()

        def served() -> int:  # connections the pool handed out since the restart
            stats = pool.get_stats()
            return stats.get("requests_num", 0) - stats.get("requests_errors", 0)

        await wait_for(lambda: _async(served() >= 3), timeout=60, what="the loop reading again")
        assert not loop.done(), loop
    finally:
        await cancel_and_wait([loop], 5.0)
        await pool.close()
        await asyncio.to_thread(pg.stop)


async def _async(value: bool) -> bool:
    return value
