"""The migrated schema equals the declared one; migrations are idempotent and locked."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import UTC, date, datetime

from psycopg import sql

from eventos.db import Conn, connect
from eventos.db.migrate import drop_expired_partitions, ensure_partitions, migrate, partition_name
from eventos.local.embedded_pg import bin_dir
from eventos.settings import DatabaseSettings
from eventos.testing.plugin import PostgresForTests


def _dump(url: str) -> str:
    out = subprocess.run(
        [
            str(bin_dir() / "pg_dump"),
            "--schema-only",
            "--no-owner",
            "--exclude-table=schema_migrations",
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # pg_dump 16.10+ brackets its output with `\restrict <random key>` … `\unrestrict <key>`.
    keep = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("--")]
    return "\n".join(ln for ln in keep if not ln.startswith(("\\restrict ", "\\unrestrict ")))


async def test_migrated_schema_equals_declared(postgres_server: PostgresForTests) -> None:
    """Both databases are made now, so their daily partitions are of the same day (the session's
    template is migrated at its start, which may be yesterday)."""
    from importlib import resources

    text = (resources.files("eventos.db") / "schema.sql").read_text()
    migrated, declared = "migrated_schema_check", "declared_schema_check"
    for name in (migrated, declared):
        ident = sql.Identifier(name)
        postgres_server.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(ident))
        postgres_server.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        async with await connect(DatabaseSettings(url=postgres_server.url(migrated))) as conn:
            await migrate(conn)
        settings = DatabaseSettings(url=postgres_server.url(declared))
        async with await connect(settings, autocommit=True) as conn:
            await conn.execute(text.encode())
            await ensure_partitions(conn, datetime.now(UTC).date())
        assert _dump(postgres_server.url(migrated)) == _dump(postgres_server.url(declared))
    finally:
        for name in (migrated, declared):
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            postgres_server.execute(drop.format(sql.Identifier(name)))


async def test_migrate_twice_applies_nothing_and_runs_under_one_lock(
    db_settings: DatabaseSettings,
) -> None:
    conns = [await connect(db_settings) for _ in range(3)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    assert [len(r) for r in results] == [0, 0, 0]


async def test_every_connection_carries_both_timeouts(conn: Conn) -> None:
    cur = await conn.execute("SHOW statement_timeout")
    assert (await cur.fetchone() or {})["statement_timeout"] == "5s"
    cur = await conn.execute("SHOW idle_in_transaction_session_timeout")
    assert (await cur.fetchone() or {})["idle_in_transaction_session_timeout"] == "10s"


async def test_partitions_are_created_ahead_and_dropped_after_retention(conn: Conn) -> None:
    await conn.set_autocommit(True)
    today = date(2031, 5, 10)
    created = await ensure_partitions(conn, today, days_ahead=2)
    assert created == [partition_name(date(2031, 5, d)) for d in (9, 10, 11, 12)]
    assert await ensure_partitions(conn, today, days_ahead=2) == []
    dropped = await drop_expired_partitions(conn, date(2031, 5, 17), retention_days=7)
    assert partition_name(date(2031, 5, 9)) in dropped
    assert all(name < partition_name(date(2031, 5, 10)) for name in dropped)
    cur = await conn.execute(
        "SELECT count(*) AS n FROM pg_class WHERE relname = ANY(%s)", (dropped,)
    )
    assert (await cur.fetchone() or {})["n"] == 0
