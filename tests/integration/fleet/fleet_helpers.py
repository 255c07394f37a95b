"""What the fleet tests share: backup settings for a test's database, and the databases a
restore leaves beside it dropped afterwards."""

from __future__ import annotations

from psycopg import sql

from eventos.settings import APP_DATABASE, BackupSettings, BackupTarget, TemporalSettings
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
