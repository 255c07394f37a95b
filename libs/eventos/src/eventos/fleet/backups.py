"""Backups and restore (SPEC §14, RFC-0005 §21.3; docs/backups.md).

A backup is one folder in the store: a pg_dump (custom format) of each of the instance's
databases, then `manifest.json` (id, time, reason, the release record, the migration level,
each dump's size and sha256), written last: a folder without a manifest is a partial upload and
never counts. A restore reads the manifest, downloads and verifies every dump before it touches
anything, restores each into a staging database, reconciles the app's there, swaps the staged
databases in, and reconciles Temporal (eventos.fleet.reconcile).

`take_backup` and `restore_backup` are the upgrader's snapshot and rollback too.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from eventos.db import Conn, connect
from eventos.db.sql import Q
from eventos.errors import EventOSError, NotFound
from eventos.fleet import pgtools, reconcile
from eventos.fleet.reconcile import ReconcileReport
from eventos.fleet.stores import BackupStore, open_store
from eventos.runtime.build import migration_level, running_release
from eventos.settings import APP_DATABASE, BackupSettings, DatabaseSettings

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
MANIFEST_MAX_BYTES = 1024 * 1024
DUMP_MAX_BYTES = 1 << 40  # a dump the manifest says is larger than 1 TiB is not believed
ID_PATTERN = re.compile(r"^\d{8}T\d{9}Z-[0-9a-f]{6}$")
REASON_MAX = 200
STAGED, KEPT = "__restoring", "__before_restore"
SENDS_MARGIN = timedelta(hours=1)  # sends changed this long before a backup are carried too


class BackupError(EventOSError):
    """The backup failed."""


class BackupNotFound(NotFound):
    """No such backup."""


class BackupCorrupt(BackupError):
    """The backup is damaged: it is not restored."""


class RestoreRefused(BackupError):
    """The backup cannot be restored here."""


@dataclass(frozen=True)
class Dump:
    """One database's dump in a backup."""

    name: str  # its role: app, temporal, temporal_visibility
    database: str  # its name on its server when dumped
    file: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Backup:
    """A complete backup, as its manifest describes it."""

    id: str
    created_at: datetime
    migration_level: int
    databases: tuple[Dump, ...]
    reason: str = ""
    release: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "id": self.id,
            "created_at": self.created_at.isoformat(timespec="milliseconds"),
            "reason": self.reason,
            "migration_level": self.migration_level,
            "release": self.release,
            "databases": [d.__dict__ for d in self.databases],
            "bytes": sum(d.bytes for d in self.databases),
        }

    @classmethod
    def from_manifest(cls, backup_id: str, raw: bytes) -> Backup:
        """The manifest read back; BackupCorrupt naming what is wrong with it."""
        try:
            doc = json.loads(raw)
            if doc.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, not {MANIFEST_FORMAT}")
            if doc["id"] != backup_id:
                raise ValueError(f"it names backup {doc['id']!r}")
            dumps = tuple(_dump(d) for d in doc["databases"])
            if not any(d.name == APP_DATABASE for d in dumps):
                raise ValueError("it has no dump of the app database")
            return cls(
                id=backup_id,
                created_at=datetime.fromisoformat(doc["created_at"]),
                migration_level=int(doc["migration_level"]),
                databases=dumps,
                reason=str(doc.get("reason", ""))[:REASON_MAX],
                release=dict(doc.get("release") or {}),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackupCorrupt(f"backup {backup_id}: its manifest is unreadable ({exc})") from None


def _dump(doc: dict[str, Any]) -> Dump:
    dump = Dump(
        str(doc["name"]),
        str(doc["database"]),
        str(doc["file"]),
        int(doc["bytes"]),
        str(doc["sha256"]),
    )
    if dump.file != f"{dump.name}.dump" or not re.fullmatch(r"[a-z_]{1,40}", dump.name):
        raise ValueError(f"a dump named {dump.file!r}")
    if not 0 < dump.bytes <= DUMP_MAX_BYTES or not re.fullmatch(r"[0-9a-f]{64}", dump.sha256):
        raise ValueError(f"{dump.file}: size or sha256 out of form")
    return dump


@dataclass(frozen=True)
class RestoreReport:
    """What a restore did: the backup, the databases swapped in, the reconcile, its time."""

    backup: Backup
    databases: tuple[str, ...]
    reconcile: ReconcileReport
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {
            "backup": self.backup.as_json(),
            "databases": list(self.databases),
            "reconcile": self.reconcile.as_json(),
            "seconds": round(self.seconds, 3),
        }


def new_id(now: datetime) -> str:
    """A backup id: its UTC time to the millisecond (ids sort by age, two in one second too)
    and a random suffix."""
    return f"{now.strftime('%Y%m%dT%H%M%S')}{now.microsecond // 1000:03d}Z-{secrets.token_hex(3)}"


def check_id(backup_id: str) -> str:
    """`backup_id` if it has the form of an id (it names a folder in the store), else NotFound."""
    if not ID_PATTERN.fullmatch(backup_id):
        raise BackupNotFound(f"{backup_id!r} is not a backup id (like 20260101T030000000Z-1a2b3c)")
    return backup_id


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


async def _level(url: str) -> int:
    async with await connect(DatabaseSettings(url=url)) as conn:
        row = await (await conn.execute(Q["backup_migration_level"])).fetchone()
    return int(row["level"]) if row else 0


async def take_backup(settings: BackupSettings, *, reason: str) -> Backup:
    """Dump every database of `settings` to its store; the manifest goes last."""
    store = open_store(settings)
    now = datetime.now(UTC)
    backup_id = new_id(now)
    level = await _level(settings.app_url())
    dumps = []
    with tempfile.TemporaryDirectory(prefix="eventos-backup-") as tmp:
        for target in settings.databases:
            path = Path(tmp) / f"{target.name}.dump"
            args = ["--format=custom", "--lock-wait-timeout=30000", f"--file={path}"]
            await pgtools.run_tool(
                settings, "pg_dump", args, target.url, f"dumping the {target.name} database"
            )
            dump = Dump(
                target.name,
                pgtools.database_name(target.url),
                path.name,
                path.stat().st_size,
                _sha256(path),
            )
            await store.put_file(f"{backup_id}/{dump.file}", path)
            dumps.append(dump)
    backup = Backup(
        backup_id, now, level, tuple(dumps), reason[:REASON_MAX], running_release().as_json()
    )
    await store.put_bytes(f"{backup_id}/{MANIFEST}", json.dumps(backup.as_json()).encode())
    await _prune(store, settings.keep)
    return backup


async def list_backups(settings: BackupSettings) -> list[Backup]:
    """Every complete backup in the store, newest first (folders without a manifest are not
    backups: an upload that did not finish)."""
    store = open_store(settings)
    found = []
    for folder in sorted(await store.folders(), reverse=True):
        if not ID_PATTERN.fullmatch(folder):
            continue
        raw = await store.get_bytes(f"{folder}/{MANIFEST}", MANIFEST_MAX_BYTES)
        if raw is not None:
            found.append(Backup.from_manifest(folder, raw))
    return found


async def _prune(store: BackupStore, keep: int) -> None:
    """Remove complete backups beyond the newest `keep` (partial folders older than the oldest
    kept one go too: they never finished)."""
    folders = sorted((f for f in await store.folders() if ID_PATTERN.fullmatch(f)), reverse=True)
    complete = [f for f in folders if await store.get_bytes(f"{f}/{MANIFEST}", MANIFEST_MAX_BYTES)]
    if len(complete) <= keep:
        return
    oldest_kept = complete[keep - 1]
    for folder in folders:
        if folder < oldest_kept:
            await store.remove(folder)


async def read_backup(settings: BackupSettings, backup_id: str) -> Backup:
    """One backup's manifest; BackupNotFound when the store has none (a partial upload)."""
    store = open_store(settings)
    raw = await store.get_bytes(f"{check_id(backup_id)}/{MANIFEST}", MANIFEST_MAX_BYTES)
    if raw is None:
        raise BackupNotFound(
            f"no backup {backup_id} in {store.where}: it has no manifest "
            "(a backup whose upload did not finish never counts)"
        )
    return Backup.from_manifest(backup_id, raw)


async def _fetch_verified(store: BackupStore, backup: Backup, dump: Dump, folder: Path) -> Path:
    path = folder / dump.file
    await store.get_file(f"{backup.id}/{dump.file}", path, dump.bytes)
    size = path.stat().st_size
    if size != dump.bytes:
        raise BackupCorrupt(
            f"backup {backup.id}: {dump.file} has {size} bytes, "
            f"the manifest says {dump.bytes} (truncated?)"
        )
    if _sha256(path) != dump.sha256:
        raise BackupCorrupt(f"backup {backup.id}: {dump.file} does not match its sha256")
    return path


def _targets(settings: BackupSettings, backup: Backup) -> dict[str, str]:
    urls = {t.name: t.url for t in settings.databases}
    missing = [d.name for d in backup.databases if d.name not in urls]
    if missing:
        raise RestoreRefused(
            f"backup {backup.id} holds {', '.join(missing)}, which this "
            "instance does not configure (EVENTOS_BACKUP_<NAME>_DATABASE_URL)"
        )
    if backup.migration_level > migration_level():
        raise RestoreRefused(
            f"backup {backup.id} is at migration {backup.migration_level}; this "
            f"code knows migrations up to {migration_level()}: restore it "
            "with the release that took it"
        )
    return {d.name: urls[d.name] for d in backup.databases}


async def restore_backup(
    settings: BackupSettings,
    backup_id: str,
    temporal_back: Callable[[], Awaitable[None]] | None = None,
) -> RestoreReport:
    """Restore every database of the backup, then reconcile (eventos.fleet.reconcile).
    `temporal_back` is awaited once the databases are swapped in, before Temporal is
    reconciled: a caller that stopped its Temporal server on them starts it again there."""
    started = time.monotonic()
    backup = await read_backup(settings, backup_id)
    urls = _targets(settings, backup)
    store = open_store(settings)
    reason = f"restore of backup {backup.id}"
    with tempfile.TemporaryDirectory(prefix="eventos-restore-") as tmp:
        files = {
            d.name: await _fetch_verified(store, backup, d, Path(tmp)) for d in backup.databases
        }
        for name, path in files.items():
            await _stage(settings, urls[name], path, name)
    staged_app = pgtools.with_database(
        urls[APP_DATABASE], _staged(pgtools.database_name(urls[APP_DATABASE]))
    )
    async with await connect(DatabaseSettings(url=staged_app), autocommit=True) as conn:
        failed, pending, streams = await reconcile.reconcile_database(conn, reason)
        kept = await _keep_sends(settings, urls[APP_DATABASE], conn, backup)
    for name in files:
        await _swap(settings, urls[name])
    if temporal_back is not None:
        await temporal_back()
    runs = schedules = 0
    if settings.temporal is not None:
        runs, schedules = await reconcile.clear_temporal(
            settings.temporal, reason, settings.transfer_timeout_s
        )
    intent, outcome = await reconcile.rearm(urls[APP_DATABASE], settings.rearm_wait_s)
    report = ReconcileReport(failed, kept, pending, streams, runs, schedules, intent, outcome)
    return RestoreReport(backup, tuple(files), report, time.monotonic() - started)


async def _keep_sends(settings: BackupSettings, url: str, staged: Conn, backup: Backup) -> int:
    """The live database's sends carried into the staged one (none when it is gone)."""
    async with pgtools.maintenance(settings, url) as conn:
        if not await pgtools.database_exists(conn, pgtools.database_name(url)):
            return 0
    async with await connect(DatabaseSettings(url=url)) as live:
        # The dumps are not one snapshot in time with the sends: a margin before it.
        return await reconcile.keep_sends(live, staged, backup.created_at - SENDS_MARGIN)


def _staged(live: str) -> str:
    return pgtools.derived_name(live, STAGED)


async def _stage(settings: BackupSettings, url: str, path: Path, name: str) -> None:
    """Restore one dump into a fresh staging database beside the live one."""
    live = pgtools.database_name(url)
    staged = _staged(live)
    async with pgtools.maintenance(settings, url) as conn:
        await pgtools.drop_database(conn, staged)
        await pgtools.create_database(conn, staged)
    args = ["--no-owner", "--no-acl", "--exit-on-error", str(path)]
    try:
        await pgtools.run_tool(
            settings,
            "pg_restore",
            args,
            pgtools.with_database(url, staged),
            f"restoring the {name} database",
        )
    except BaseException:
        async with pgtools.maintenance(settings, url) as conn:
            await pgtools.drop_database(conn, staged)
        raise


async def _swap(settings: BackupSettings, url: str) -> None:
    live = pgtools.database_name(url)
    async with pgtools.maintenance(settings, url) as conn:
        await pgtools.swap_in(
            conn, live, _staged(live), pgtools.derived_name(live, KEPT), settings.call_timeout_s
        )
