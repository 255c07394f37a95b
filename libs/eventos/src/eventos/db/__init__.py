"""The database layer (SPEC §5): pools, named queries (`queries/*.sql`), migrations and the
declared schema. Driver errors are translated here, once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from eventos.db.sql import Queries, load_queries
from eventos.errors import DatabaseUnavailable, RecordInvalid
from eventos.settings import DatabaseSettings

__all__ = [
    "Queries",
    "connect",
    "connection_kwargs",
    "connection_options",
    "load_queries",
    "open_pool",
    "translate",
]

Conn = psycopg.AsyncConnection[dict[str, Any]]


def connection_options(settings: DatabaseSettings) -> str:
    """Server options set on every connection (SPEC §5: both timeouts always on)."""
    return (
        f"-c statement_timeout={settings.statement_timeout_ms} "
        f"-c idle_in_transaction_session_timeout={settings.idle_in_transaction_timeout_ms}"
    )


def connection_kwargs(settings: DatabaseSettings) -> dict[str, Any]:
    """libpq parameters of every connection: the server options (both timeouts), the
    connect timeout and TCP keepalives (a vanished server is noticed in about a minute, not
    the kernel's two hours, and a statement waiting on it fails instead of hanging)."""
    return {
        "options": connection_options(settings),
        "connect_timeout": settings.connect_timeout_s,
        "keepalives": 1,
        "keepalives_idle": settings.keepalives_idle_s,
        "keepalives_interval": settings.keepalives_interval_s,
        "keepalives_count": settings.keepalives_count,
    }


async def connect(settings: DatabaseSettings, *, autocommit: bool = False) -> Conn:
    """One connection with the instance's timeouts and dict rows."""
    try:
        return await psycopg.AsyncConnection.connect(
            settings.url,
            autocommit=autocommit,
            row_factory=dict_row,
            **connection_kwargs(settings),
        )
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(str(exc).strip()) from exc


async def open_pool(
    settings: DatabaseSettings, *, wait: bool = True, autocommit: bool = False
) -> AsyncConnectionPool[Conn]:
    """An open pool whose connections carry the instance's timeouts. With `autocommit` each
    statement is its own transaction (no implicit BEGIN/COMMIT round trips); work that must
    be atomic across statements then says so with `conn.transaction()`."""
    pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
        settings.url,
        min_size=settings.pool_min,
        max_size=settings.pool_max,
        kwargs={**connection_kwargs(settings), "row_factory": dict_row, "autocommit": autocommit},
        open=False,
        timeout=settings.pool_timeout_s,
        reconnect_timeout=0,
    )
    await pool.open(wait=wait, timeout=10.0)
    return pool


# SQLSTATE classes that say "this record cannot be stored" (its own fault), not "the database
# is unavailable": data exceptions (22: an untranslatable character, a value out of range),
# integrity violations (23) and program limits (54: an index row over its size).
# psycopg files class 54 under OperationalError, so the class is read from the SQLSTATE.
RECORD_ERROR_CLASSES = ("22", "23", "54")


def is_record_error(exc: BaseException) -> bool:
    """Whether a driver error is the fault of the data sent, not of the connection."""
    if isinstance(exc, UnicodeEncodeError | RecursionError):
        return True  # a lone surrogate cannot be encoded for the wire; JSON nested too deep
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] in RECORD_ERROR_CLASSES


@asynccontextmanager
async def translate() -> AsyncIterator[None]:
    """Translate driver errors: a record's own fault into RecordInvalid, connection errors (a
    pool timeout among them) and timeouts into DatabaseUnavailable."""
    try:
        yield
    except (psycopg.Error, UnicodeEncodeError, RecursionError) as exc:
        if is_record_error(exc):
            reason = getattr(exc, "sqlstate", None) or type(exc).__name__
            raise RecordInvalid(f"unstorable ({reason})") from exc
        if isinstance(exc, psycopg.errors.TransactionRollback):  # deadlock, serialization
            raise DatabaseUnavailable("transaction rolled back; retry") from exc
        if isinstance(exc, psycopg.errors.QueryCanceled):
            raise DatabaseUnavailable("statement timeout") from exc
        if isinstance(
            exc, psycopg.OperationalError | psycopg.InterfaceError | psycopg.errors.AdminShutdown
        ):
            raise DatabaseUnavailable(str(exc).strip() or "database unavailable") from exc
        raise
