"""BackupSettings (EVENTOS_BACKUP_*): a bad store fails at boot naming the variable; credentials
and Temporal's password come from files too and never show when printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventos.errors import ConfigError
from eventos.settings import BackupSettings

APP = "postgresql://eventos:app-password@db:5432/eventos"


def settings(**env: str) -> BackupSettings:
    return BackupSettings.from_env({"EVENTOS_DATABASE_URL": APP, **env})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "EVENTOS_BACKUP_STORE is required"),
        ({"EVENTOS_BACKUP_STORE": "ftp://host/x"}, "must be s3://bucket[/prefix] or file:///path"),
        ({"EVENTOS_BACKUP_STORE": "s3://bucket"}, "needs EVENTOS_BACKUP_S3_ENDPOINT"),
        ({"EVENTOS_BACKUP_STORE": "file:///b", "EVENTOS_BACKUP_KEEP": "0"}, "EVENTOS_BACKUP_KEEP"),
        (
            {"EVENTOS_BACKUP_STORE": "file:///b", "EVENTOS_BACKUP_DUMP_TIMEOUT_S": "0"},
            "EVENTOS_BACKUP_DUMP_TIMEOUT_S must be between",
        ),
    ],
)
def test_a_bad_setting_fails_at_boot_naming_it(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings(**env)


def test_keys_and_temporals_password_come_from_files_and_never_print(tmp_path: Path) -> None:
    (tmp_path / "access").write_text("AKIA-TEST\n")
    (tmp_path / "secret").write_text("s3-secret-value\n")
    (tmp_path / "pw").write_text("temporal-pw\n")
    found = settings(
        EVENTOS_BACKUP_STORE="s3://acme/inst-1",
        EVENTOS_BACKUP_S3_ENDPOINT="http://127.0.0.1:8333",
        EVENTOS_BACKUP_S3_ACCESS_KEY_FILE=str(tmp_path / "access"),
        EVENTOS_BACKUP_S3_SECRET_KEY_FILE=str(tmp_path / "secret"),
        EVENTOS_BACKUP_TEMPORAL_DATABASE_URL="host=db port=5432 user=temporal dbname=temporal",
        EVENTOS_BACKUP_TEMPORAL_PASSWORD_FILE=str(tmp_path / "pw"),
    )
    assert (found.s3_access_key, found.s3_secret_key) == ("AKIA-TEST", "s3-secret-value")
    assert [t.name for t in found.databases] == ["app", "temporal"]
    assert "password=temporal-pw" in found.databases[1].url
    shown = repr(found)
    for secret in ("AKIA-TEST", "s3-secret-value", "temporal-pw", "app-password"):
        assert secret not in shown
