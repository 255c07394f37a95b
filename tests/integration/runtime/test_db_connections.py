"""PostgreSQL connections are bounded (issue 25 point 9): every connection, pooled or single,
has TCP keepalives and a statement deadline, and a pool checkout waits at most its timeout;
the values come from the database settings object (`EVENTOS_DB_*`)."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from eventos.db import connect, open_pool
from eventos.errors import ConfigError
from eventos.settings import DatabaseSettings

KEEPALIVES = {"keepalives": "1", "keepalives_idle": "7", "keepalives_interval": "3",
              "keepalives_count": "4"}  # fmt: skip


def tuned(db_settings: DatabaseSettings) -> DatabaseSettings:
    env = {"EVENTOS_DATABASE_URL": db_settings.url, "EVENTOS_DB_STATEMENT_TIMEOUT_MS": "1500",
           "EVENTOS_DB_KEEPALIVES_IDLE_S": "7", "EVENTOS_DB_KEEPALIVES_INTERVAL_S": "3",
           "EVENTOS_DB_KEEPALIVES_COUNT": "4", "EVENTOS_DB_POOL_TIMEOUT_S": "0.5",
           "EVENTOS_DB_POOL_MAX": "1"}  # fmt: skip
    return DatabaseSettings.from_env(env)


def test_the_defaults_are_on() -> None:
    s = DatabaseSettings(url="postgresql://x@h/db")
    assert (s.statement_timeout_ms, s.keepalives_idle_s, s.keepalives_interval_s,
            s.keepalives_count, s.pool_timeout_s) == (5000, 30, 10, 3, 5.0)  # fmt: skip
    with pytest.raises(ConfigError, match="EVENTOS_DB_KEEPALIVES_COUNT"):
        DatabaseSettings.from_env({"EVENTOS_DATABASE_URL": "postgresql://x@h/db",
                                   "EVENTOS_DB_KEEPALIVES_COUNT": "0"})  # fmt: skip


async def test_a_pooled_connection_has_keepalives_and_a_statement_deadline(
    db_settings: DatabaseSettings,
) -> None:
    settings = tuned(db_settings)
    pool = await open_pool(settings)
    try:
        async with pool.connection() as conn:
            cur = await conn.execute("SHOW statement_timeout")
            assert (await cur.fetchone() or {})["statement_timeout"] == "1500ms"
            params = conn.info.get_parameters()
            assert {k: params.get(k) for k in KEEPALIVES} == KEEPALIVES
            with pytest.raises(psycopg.errors.QueryCanceled):  # past its deadline
                await conn.execute("SELECT pg_sleep(5)")
        async with pool.connection():  # the one connection is taken: a checkout waits 0.5 s
            with pytest.raises(PoolTimeout):
                async with pool.connection():
                    pass
    finally:
        await pool.close()


async def test_a_single_connection_has_them_too(db_settings: DatabaseSettings) -> None:
    settings = dataclasses.replace(tuned(db_settings), statement_timeout_ms=2500)
    async with await connect(settings) as conn:
        cur = await conn.execute("SHOW statement_timeout")
        assert (await cur.fetchone() or {})["statement_timeout"] == "2500ms"
        params = conn.info.get_parameters()
        assert {k: params.get(k) for k in KEEPALIVES} == KEEPALIVES
