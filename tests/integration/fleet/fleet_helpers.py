"""What the fleet tests share: a test database with a table of notes, backup settings for it,
and the databases a restore leaves beside it dropped afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from eventos.settings import (
    APP_DATABASE,
    BackupSettings,
    BackupTarget,
    DatabaseSettings,
    TemporalSettings,
)
from eventos.testing.plugin import PostgresForTests


def settings_for(url: str, store: str, *, temporal: TemporalSettings | None = None,
                 keep: int = 14, **s3: str) -> BackupSettings:  # fmt: skip
    """Backups of the database at `url` to `store`, with short deadlines for a test."""
    return BackupSettings(
        store=store, databases=(BackupTarget(APP_DATABASE, url),), temporal=temporal, keep=keep,
        dump_timeout_s=120, transfer_timeout_s=120, call_timeout_s=10, rearm_wait_s=1, **s3,
    )  # fmt: skip


def cleanup_restore_leftovers(server: PostgresForTests, db_name: str) -> None:
    """Drop the databases a restore of `db_name` staged or kept."""
    for suffix in ("__restoring", "__before_restore"):
        ident = sql.Identifier(db_name + suffix)
        server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def notes(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT text FROM backup_notes ORDER BY id")]


def note(url: str, text: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO backup_notes (text) VALUES (%s)", (text,))


@pytest.fixture
def app(db_settings: DatabaseSettings, postgres_server: PostgresForTests,
        db_name: str) -> Iterator[str]:  # fmt: skip
    """The test's database with a table of notes to tell one state from another."""
    with psycopg.connect(db_settings.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE backup_notes (id serial PRIMARY KEY, text text NOT NULL)")
    yield db_settings.url
    cleanup_restore_leftovers(postgres_server, db_name)
