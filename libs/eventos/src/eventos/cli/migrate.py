"""`eventosctl migrate`: the database migrations, against the database itself (docs/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import psycopg

from eventos.cli.instance import START_HINT, NoInstance, Unreachable, load_stack
from eventos.db import Conn, connect
from eventos.db.migrate import Migration, migrate
from eventos.errors import DatabaseUnavailable
from eventos.settings import DatabaseSettings

CONNECT_RETRY_S = 1.0


def cmd_migrate(args: argparse.Namespace) -> int:
    url = args.database_url or os.environ.get("EVENTOS_DATABASE_URL")
    if not url:
        url = load_stack(args).get("database", {}).get("url")
    if not url:
        raise NoInstance(f"no database: set EVENTOS_DATABASE_URL, or {START_HINT}")

    async def run() -> list[Migration]:
        conn = await _connected(DatabaseSettings(url=url), max(0.0, args.wait))
        async with conn:
            return await migrate(conn)

    try:
        applied = asyncio.run(run())
    except DatabaseUnavailable as exc:
        raise Unreachable(f"cannot reach the database at {_where(url)}: {exc}") from None
    for m in applied:
        print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        print(f"the database at {_where(url)} is up to date")
    return 0


async def _connected(settings: DatabaseSettings, wait_s: float) -> Conn:
    """A connection, trying again every CONNECT_RETRY_S for up to `wait_s` (an upgrade's
    migrate Job may start while the database's Service has no ready endpoint on a loaded node)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await connect(settings)
        except DatabaseUnavailable:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(CONNECT_RETRY_S)


def _where(url: str) -> str:
    """host:port/dbname of a database URL, without credentials."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(unparsable URL)"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
