"""Forward-only migrations applied under an advisory lock, and ingress partition upkeep."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from importlib import resources

from psycopg import sql

from eventos.db import Conn
from eventos.db.sql import Q

log = logging.getLogger(__name__)

# Any stable 64-bit number: every migrator takes the same lock, so only one applies at a time.
MIGRATION_LOCK_KEY = 0x45564F534D494752  # "EVOSMIGR"
PARTITION_PREFIX = "bus_ingress_p"
KEEP_MOVE_TIMEOUT_MS = 300_000  # moving one day's dead rows before its partition drops


@dataclass(frozen=True)
class Migration:
    """One forward-only migration file."""

    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def shipped_migrations() -> list[Migration]:
    """The migrations in `eventos/db/migrations`, in version order."""
    found: list[Migration] = []
    folder = resources.files("eventos.db") / "migrations"
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version, _, rest = entry.name.partition("_")
            found.append(Migration(int(version), rest.removesuffix(".sql"), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must be 1..n without gaps, got {versions}")
    return found


async def migrate(conn: Conn) -> list[Migration]:
    """Apply every shipped migration not yet applied; returns those applied now."""
    applied_now: list[Migration] = []
    await conn.set_autocommit(True)
    await conn.execute(Q["migration_lock"], {"key": MIGRATION_LOCK_KEY})
    try:
        await conn.execute(Q["migration_table_create"])
        cur = await conn.execute(Q["migration_list"])
        done = {int(str(r["version"])): str(r["checksum"]) for r in await cur.fetchall()}
        for m in shipped_migrations():
            if m.version in done:
                if done[m.version] != m.checksum:
                    raise RuntimeError(f"migration {m.version} changed after it was applied")
                continue
            async with conn.transaction():
                await conn.execute(m.text.encode())  # bytes: a file is not a LiteralString
                await conn.execute(
                    Q["migration_record"],
                    {"version": m.version, "name": m.name, "checksum": m.checksum},
                )
            log.info("applied migration %04d_%s", m.version, m.name)
            applied_now.append(m)
        await ensure_partitions(conn, datetime.now(UTC).date())
    finally:
        await conn.execute(Q["migration_unlock"], {"key": MIGRATION_LOCK_KEY})
    return applied_now


def partition_name(day: date) -> str:
    """The name of the bus_ingress partition holding `day` (UTC)."""
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


async def ensure_partitions(conn: Conn, today: date, *, days_ahead: int = 7) -> list[str]:
    """Create the daily partitions from yesterday to `days_ahead` days ahead."""
    created: list[str] = []
    cur = await conn.execute(Q["partition_list"])
    existing = {str(r["name"]) for r in await cur.fetchall()}
    for offset in range(-1, days_ahead + 1):
        day = today + timedelta(days=offset)
        name = partition_name(day)
        if name in existing:
            continue
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        stmt = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} PARTITION OF bus_ingress FOR VALUES FROM ({}) TO ({})"
        ).format(sql.Identifier(name), start, start + timedelta(days=1))
        await conn.execute(stmt)
        created.append(name)
    return created


async def drop_expired_partitions(conn: Conn, today: date, *, retention_days: int) -> list[str]:
    """Drop daily partitions wholly older than the retention (ingress bodies: 7 days), each
    one's dead rows moved first to bus_ingress_kept (dead letters stay 90 days)."""
    dropped: list[str] = []
    cutoff = today - timedelta(days=retention_days)
    cur = await conn.execute(Q["partition_list"])
    for row in await cur.fetchall():
        name = str(row["name"])
        day = datetime.strptime(name.removeprefix(PARTITION_PREFIX), "%Y%m%d").date()
        if day < cutoff:
            await _drop_keeping_dead(conn, name)
            dropped.append(name)
    return dropped


async def _drop_keeping_dead(conn: Conn, name: str) -> None:
    """Detach a partition, move its dead rows to the default partition, drop it: one
    transaction, so a dead letter is listed before and after, never lost between."""
    table = sql.Identifier(name)
    async with conn.transaction():
        # A day of a dead-letter storm may hold many rows: the move is not a hot-path read.
        await conn.execute(Q["statement_timeout_local"], {"ms": str(KEEP_MOVE_TIMEOUT_MS)})
        await conn.execute(sql.SQL("ALTER TABLE bus_ingress DETACH PARTITION {}").format(table))
        # Same columns in the same order: the partition was made PARTITION OF bus_ingress.
        await conn.execute(
            sql.SQL("INSERT INTO bus_ingress SELECT * FROM {} WHERE status = 'dead'").format(table)
        )
        await conn.execute(sql.SQL("DROP TABLE {}").format(table))
