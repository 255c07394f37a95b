"""Backups to a volume (a folder) on real PostgreSQL: take, list, restore; a damaged backup and a
partial upload are refused before anything is touched (docs/backups.md)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from fleet_helpers import app, note, notes, settings_for  # noqa: F401 (app: a fixture)
from psycopg import sql

from eventos.fleet.backups import (
    MANIFEST,
    BackupCorrupt,
    BackupNotFound,
    list_backups,
    restore_backup,
    take_backup,
)
from eventos.fleet.pgtools import database_name
from eventos.runtime.build import migration_level
from eventos.settings import BackupSettings
from eventos.testing.plugin import PostgresForTests


@pytest.fixture
def volume(tmp_path: Path, app: str) -> BackupSettings:
    return settings_for(app, f"file://{tmp_path / 'backups'}")


async def test_a_volume_backup_restores_the_state_it_was_taken_in(
    app: str, volume: BackupSettings, tmp_path: Path
) -> None:
    note(app, "before")
    first = await take_backup(volume, reason="test")
    note(app, "after")
    second = await take_backup(volume, reason="test")

    listed = await list_backups(volume)
    assert [b.id for b in listed] == [second.id, first.id]  # newest first
    assert first.migration_level == migration_level()
    assert [d.name for d in first.databases] == ["app"]
    manifest = json.loads((tmp_path / "backups" / first.id / MANIFEST).read_text())
    assert manifest["release"]["migrations"] == migration_level()
    assert (
        manifest["databases"][0]["bytes"]
        == (tmp_path / "backups" / first.id / "app.dump").stat().st_size
    )

    note(app, "lost by the restore")
    report = await restore_backup(volume, first.id)
    assert notes(app) == ["before"]
    assert report.databases == ("app",)
    assert report.backup.id == first.id
    # The database that was live is kept beside it, until the next restore.
    kept = psycopg.conninfo.make_conninfo(app, dbname=database_name(app) + "__before_restore")
    assert notes(kept) == ["before", "after", "lost by the restore"]


async def test_a_truncated_or_altered_dump_is_refused_and_nothing_is_touched(
    app: str, volume: BackupSettings, tmp_path: Path
) -> None:
    note(app, "before")
    backup = await take_backup(volume, reason="test")
    note(app, "after")
    dump = tmp_path / "backups" / backup.id / "app.dump"
    whole = dump.read_bytes()
    dump.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(BackupCorrupt, match=r"app\.dump has \d+ bytes, the manifest says"):
        await restore_backup(volume, backup.id)
    dump.write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))
    with pytest.raises(BackupCorrupt, match=r"app\.dump does not match its sha256"):
        await restore_backup(volume, backup.id)
    assert notes(app) == ["before", "after"]


async def test_a_backup_without_its_manifest_is_not_a_backup(
    app: str, volume: BackupSettings, tmp_path: Path
) -> None:
    backup = await take_backup(volume, reason="test")
    (tmp_path / "backups" / backup.id / MANIFEST).unlink()
    assert await list_backups(volume) == []
    with pytest.raises(BackupNotFound, match="it has no manifest"):
        await restore_backup(volume, backup.id)
    with pytest.raises(BackupNotFound, match="is not a backup id"):
        await restore_backup(volume, "../../etc")


async def test_old_backups_beyond_keep_are_removed(app: str, tmp_path: Path) -> None:
    settings = settings_for(app, f"file://{tmp_path / 'backups'}", keep=2)
    ids = [(await take_backup(settings, reason="test")).id for _ in range(3)]
    assert [b.id for b in await list_backups(settings)] == [ids[2], ids[1]]
    assert sorted(p.name for p in (tmp_path / "backups").iterdir()) == sorted(ids[1:])


async def test_a_backup_restores_onto_a_server_that_lost_the_database(
    app: str, volume: BackupSettings, postgres_server: PostgresForTests, db_name: str
) -> None:
    note(app, "kept")
    backup = await take_backup(volume, reason="test")
    postgres_server.execute(
        sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(db_name))
    )
    report = await restore_backup(volume, backup.id)
    assert notes(app) == ["kept"]
    assert report.reconcile.sends_kept == 0
