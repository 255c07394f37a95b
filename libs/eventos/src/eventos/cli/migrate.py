"""`eventosctl migrate`: the database migrations, against the database itself (docs/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import os

import psycopg

from eventos.cli.instance import START_HINT, NoInstance, Unreachable, load_stack
from eventos.db import connect
from eventos.db.migrate import Migration, migrate
from eventos.errors import DatabaseUnavailable
from eventos.settings import DatabaseSettings


def cmd_migrate(args: argparse.Namespace) -> int:
    url = args.database_url or os.environ.get("EVENTOS_DATABASE_URL")
    if not url:
        url = load_stack(args).get("database", {}).get("url")
    if not url:
        raise NoInstance(f"no database: set EVENTOS_DATABASE_URL, or {START_HINT}")

    async def run() -> list[Migration]:
        conn = await connect(DatabaseSettings(url=url))
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


def _where(url: str) -> str:
    """host:port/dbname of a database URL, without credentials."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(unparsable URL)"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
