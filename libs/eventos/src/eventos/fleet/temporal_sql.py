"""Temporal's schema tool on the instance's PostgreSQL (tier L): the login it is given, and
`temporal-sql-tool` run on one database. `make run TIER=L` sets up and updates the schemas with
it (eventos.local.temporal_server), and the upgrader updates them to the target's version
before the target's server starts (eventos.fleet.local_driver).

A build of the server (`.tools/temporal-server/v<version>`, settings.ServerTools) holds the tool
in `bin/` and the schema files it applies in `schema/postgresql/v12/`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from eventos.errors import EventOSError

SQL_TOOL = "temporal-sql-tool"
PLUGIN = "postgres12"
# The schema folders inside the module source, copied beside the binaries by `make tools`.
SCHEMA_DIRS = {"main": "temporal/versioned", "visibility": "visibility/versioned"}
TOOL_TIMEOUT_S = 120.0


class SqlToolError(EventOSError):
    """temporal-sql-tool could not run, or failed."""


@dataclass(frozen=True)
class SqlLogin:
    """Host, port, user and password of the instance's PostgreSQL, from its URL."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)

    @classmethod
    def of_url(cls, url: str) -> SqlLogin:
        info = psycopg.conninfo.conninfo_to_dict(url)
        host = str(info.get("host") or "127.0.0.1")
        if host.startswith("/"):
            raise SqlToolError("the Temporal server needs PostgreSQL over TCP, not a socket path")
        return cls(
            host=host,
            port=int(info.get("port") or 5432),
            user=str(info.get("user") or "postgres"),
            password=str(info.get("password") or ""),
        )


def schema_root(build: Path) -> Path:
    """schema/postgresql/v12 of the module the build was made from, beside its binaries."""
    found = build / "schema" / "postgresql" / "v12"
    if not found.is_dir():
        raise SqlToolError(f"{found} is missing: run `make tools` to build the server again")
    return found


def sql_tool(tool: Path, login: SqlLogin, database: str, *command: str) -> None:
    """Run `temporal-sql-tool … command` on `database`; SqlToolError with its output."""
    args = [str(tool), "--plugin", PLUGIN, "--endpoint", login.host, "--port", str(login.port)]
    args += ["--user", login.user, "--database", database, *command]
    env = {"SQL_PASSWORD": login.password}  # its only input outside its arguments
    try:
        done = subprocess.run(args, capture_output=True, text=True, env=env,
                              timeout=TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SqlToolError(f"temporal-sql-tool {' '.join(command)} on {database}: {exc}") from None
    if done.returncode != 0:
        raise SqlToolError(f"temporal-sql-tool {' '.join(command)} on {database} failed:\n"
                           f"{done.stdout}{done.stderr}")  # fmt: skip


def update_schema(build: Path, login: SqlLogin, databases: dict[str, str]) -> None:
    """Update each database (by kind: `main`, `visibility`) to the build's schema version
    (the tool applies the versions above the database's, a no-op when there are none)."""
    tool, root = build / "bin" / SQL_TOOL, schema_root(build)
    for kind, database in databases.items():
        sql_tool(tool, login, database, "update-schema", "-d", str(root / SCHEMA_DIRS[kind]))
