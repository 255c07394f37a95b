"""`eventosctl backup`, `backups` and `restore` on a local instance's stack file (docs/cli.md):
the store defaults to the instance's .eventos/backups, restore asks first, an unknown backup is
exit 3."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fleet_helpers import cleanup_restore_leftovers

from eventos.cli.app import main
from eventos.settings import DatabaseSettings
from eventos.testing.plugin import PostgresForTests


@pytest.fixture
def stack(tmp_path: Path, db_settings: DatabaseSettings, postgres_server: PostgresForTests,
          db_name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:  # fmt: skip
    """A stack file as `make run` writes it, naming the test's database (no Temporal)."""
    for var in ("EVENTOS_DATABASE_URL", "EVENTOS_BACKUP_STORE", "TEMPORAL_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("EVENTOS_BACKUP_REARM_WAIT_S", "1")  # no relay applies the re-arm here
    with psycopg.connect(db_settings.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE backup_notes (text text)")
        conn.execute("INSERT INTO backup_notes VALUES ('before')")
    state = tmp_path / ".eventos"
    state.mkdir()
    doc = {"root": str(tmp_path), "database": {"url": db_settings.url},
           "temporal": {"tier": "S", "address": ""}}  # fmt: skip
    (state / "stack.json").write_text(json.dumps(doc))
    yield state / "stack.json"
    cleanup_restore_leftovers(postgres_server, db_name)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_backup_list_and_restore_from_the_command_line(
    stack: Path, db_settings: DatabaseSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "backup", "--stack", str(stack), "-o", "json")
    assert code == 0
    taken = json.loads(out)
    assert taken["store"] == f"file://{stack.parent / 'backups'}"
    assert (stack.parent / "backups" / taken["id"] / "manifest.json").is_file()
    with psycopg.connect(db_settings.url, autocommit=True) as conn:
        conn.execute("INSERT INTO backup_notes VALUES ('after')")

    code, out, _ = run(capsys, "backups", "--stack", str(stack))
    assert code == 0 and taken["id"] in out and "by hand" in out

    code, _, err = run(capsys, "restore", taken["id"], "--stack", str(stack))
    assert code == 1 and "nothing restored" in err  # not a terminal, no --yes: asks no one

    code, out, _ = run(capsys, "restore", taken["id"], "--yes", "--stack", str(stack), "-o", "json")
    assert code == 0
    assert json.loads(out)["backup"]["id"] == taken["id"]
    with psycopg.connect(db_settings.url) as conn:
        assert [r[0] for r in conn.execute("SELECT text FROM backup_notes")] == ["before"]

    code, _, err = run(capsys, "restore", "20200101T000000Z-abcdef", "--yes", "--stack", str(stack))
    assert code == 3 and "has no manifest" in err
