"""`eventosctl backup`, `backups` and `restore`: the instance's databases to and from its backup
store (docs/backups.md; docs/cli.md).

They work on the databases themselves, as `migrate` does: the settings are BackupSettings
(EVENTOS_BACKUP_*), and what the environment does not say comes from the nearest stack file of
`make run` (its database, its Temporal, at tier L Temporal's two databases), with the store
`file://<instance>/.eventos/backups` by default there. `restore` asks first unless `--yes`; on a
`make run TIER=L` instance it has the instance's supervisor stop the Temporal server while it
swaps Temporal's databases (the hold file, eventos.fleet.backups.HeldServer), and start it again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from eventos.cli.instance import STACK_FILE, START_HINT, NoInstance, find_stack, load_stack
from eventos.cli.operator import Add
from eventos.cli.output import Column, emit, table, time_columns
from eventos.fleet.backups import (
    TEMPORAL_HOLD,
    Backup,
    BackupNotFound,
    HeldServer,
    list_backups,
    restore_backup,
    take_backup,
)
from eventos.fleet.pgtools import with_database
from eventos.fleet.stores import open_store
from eventos.settings import BACKUP_STORE_VAR, BackupSettings

EXIT_NOT_FOUND = 3
HOLD_WAIT_S = 60.0  # the supervisor's pass, then the server's own stop (SIGKILL after 20 s)
# Temporal's databases at tier L, as eventos.local.temporal_server names them.
TIER_L_DATABASES = {
    "EVENTOS_BACKUP_TEMPORAL_DATABASE_URL": "temporal",
    "EVENTOS_BACKUP_TEMPORAL_VISIBILITY_DATABASE_URL": "temporal_visibility",
}
COLUMNS = [
    Column("ID", lambda r: r["id"], 26),
    *time_columns("CREATED", lambda r: r["created_at"]),
    Column("MIGRATION", lambda r: r["migration_level"], 9),
    Column("SIZE", lambda r: _size(r["bytes"]), 8),
    Column("DATABASES", lambda r: ",".join(d["name"] for d in r["databases"])),
    Column("REASON", lambda r: r["reason"]),
]


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def settings(args: argparse.Namespace) -> BackupSettings:
    """BackupSettings from the environment, completed from the stack file of `make run`."""
    env = dict(os.environ)
    stack = load_stack(args)
    database = stack.get("database") or {}
    temporal = stack.get("temporal") or {}
    if not env.get("EVENTOS_DATABASE_URL"):
        if not database.get("url"):
            raise NoInstance(f"no database: set EVENTOS_DATABASE_URL, or {START_HINT}")
        env["EVENTOS_DATABASE_URL"] = database["url"]
        if temporal.get("tier") == "L":
            for var, name in TIER_L_DATABASES.items():
                env.setdefault(var, with_database(database["url"], name))
    if not env.get("TEMPORAL_ADDRESS") and temporal.get("address"):
        env["TEMPORAL_ADDRESS"] = temporal["address"]
        env["TEMPORAL_NAMESPACE"] = temporal.get("namespace") or "default"
    if getattr(args, "store", None):
        env[BACKUP_STORE_VAR] = args.store
    elif not env.get(BACKUP_STORE_VAR) and stack.get("root"):
        env[BACKUP_STORE_VAR] = Path(stack["root"], ".eventos", "backups").as_uri()
    elif not env.get(BACKUP_STORE_VAR) and (found := find_stack(Path.cwd())) is not None:
        env[BACKUP_STORE_VAR] = (found.parent / "backups").absolute().as_uri()
    return BackupSettings.from_env(env)


def held_server(args: argparse.Namespace, config: BackupSettings) -> HeldServer | None:
    """The `make run` instance's own tier L server, when the restore is of that instance."""
    stack = load_stack(args)
    temporal, pid = stack.get("temporal") or {}, (stack.get("pids") or {}).get("temporal")
    database = (stack.get("database") or {}).get("url")
    if temporal.get("tier") != "L" or not temporal.get("embedded") or not pid:
        return None
    if database != config.app_url():  # the environment names another instance's database
        return None
    hold = Path(stack["root"]) / STACK_FILE.parent / TEMPORAL_HOLD
    return HeldServer(hold, int(pid), HOLD_WAIT_S)


def _line(b: dict[str, Any]) -> str:
    names = ", ".join(d["name"] for d in b["databases"])
    return (f"backup {b['id']}: {names} ({_size(b['bytes'])}) at migration "
            f"{b['migration_level']}")  # fmt: skip


def cmd_backup(args: argparse.Namespace) -> int:
    config = settings(args)
    backup = asyncio.run(take_backup(config, reason=args.reason))
    doc = {**backup.as_json(), "store": _where(config)}
    emit(args, doc, f"{_line(doc)} → {doc['store']}")
    return 0


def cmd_backups(args: argparse.Namespace) -> int:
    config = settings(args)
    found: list[Backup] = asyncio.run(list_backups(config))
    docs = [b.as_json() for b in found]
    empty = f"no backups in {_where(config)}"
    text, wide = (table(docs, COLUMNS, wide=w) for w in (False, True))
    emit(args, docs, "\n".join(text if docs else [*text, empty]),
         "\n".join(wide if docs else [*wide, empty]))  # fmt: skip
    return 0


def _ask(backup_id: str) -> bool:
    try:
        answer = input(f"restore backup {backup_id} over this instance's databases? What was "
                       "written since it was taken is set aside. [y/N] ")  # fmt: skip
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_restore(args: argparse.Namespace) -> int:
    config = settings(args)
    if not (args.yes or (sys.stdin.isatty() and _ask(args.id))):
        print("nothing restored (--yes restores without asking)", file=sys.stderr)
        return 1
    try:
        server = held_server(args, config)
        report = asyncio.run(restore_backup(config, args.id, temporal_server=server))
    except BackupNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    doc = report.as_json()
    r = doc["reconcile"]
    text = "\n".join([
        f"restored backup {args.id} ({', '.join(report.databases)}) in {doc['seconds']:.1f} s",
        f"  turns failed (orphaned): {r['turns_failed']}",
        f"  channel sends kept (their keys survive): {r['sends_kept']}",
        f"  deliveries pending again: {r['deliveries_pending']} in {r['streams']} stream(s)",
        f"  Temporal: {r['runs_terminated']} run(s) ended, {r['schedules_deleted']} "
        "schedule(s) deleted",
        f"  re-arm (intent {r['rearm_intent']}): {r['rearm']}",
    ])  # fmt: skip
    emit(args, doc, text)
    return 0


def _where(config: BackupSettings) -> str:
    return open_store(config).where


def add_commands(add: Add) -> None:
    """The three commands on the parser."""
    store_help = f"the backup store (or {BACKUP_STORE_VAR}; `make run`: .eventos/backups)"
    p = add("backup", cmd_backup, "dump the instance's databases to the backup store")
    p.add_argument("--store", help=store_help)
    p.add_argument("--reason", default="by hand", help="why, kept in the manifest ('by hand')")
    p = add("backups", cmd_backups, "the backups in the store, newest first")
    p.add_argument("--store", help=store_help)
    p = add("restore", cmd_restore, "restore a backup, then reconcile (docs/backups.md)")
    p.add_argument("id", metavar="BACKUP_ID")
    p.add_argument("--store", help=store_help)
    p.add_argument("--yes", action="store_true", help="restore without asking")
