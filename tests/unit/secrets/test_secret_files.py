"""Secret files re-read on change: the new value is used at once (within the recheck), the
previous one is offered for the overlap window and then no more; a change is logged without
the value; the admin token's file rotates the same way."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eventos.errors import ConfigError, SecretUnavailable
from eventos.secret_files import MAX_BYTES, SecretFiles, SecretVersions
from eventos.settings import AdminSettings, SecretStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_change_is_used_after_the_recheck_and_the_previous_value_kept_for_the_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "hook").write_text("old-value\n")
    clock = Clock()
    files = SecretFiles(tmp_path, overlap_s=60, recheck_s=1, clock=clock)
    assert files.read("hook") == SecretVersions(b"old-value")
    (tmp_path / "hook").write_text("new-value\n")
    assert files.read("hook") == SecretVersions(b"old-value")  # within the recheck
    clock.now += 1
    with caplog.at_level(logging.INFO):
        assert files.read("hook") == SecretVersions(b"new-value", b"old-value")
    assert "'hook' rotated" in caplog.text
    assert "old-value" not in caplog.text and "new-value" not in caplog.text
    clock.now += 59.5
    assert files.read("hook") == SecretVersions(b"new-value", b"old-value")
    clock.now += 0.5
    assert files.read("hook") == SecretVersions(b"new-value")


def test_a_rotation_is_seen_for_a_secret_not_used_before_it(tmp_path: Path) -> None:
    """Every file is read when the directory is opened: the first use after a rotation still
    knows the value it replaced."""
    (tmp_path / "hook").write_text("old-value")
    clock = Clock()
    files = SecretFiles(tmp_path, overlap_s=60, recheck_s=1, clock=clock)
    (tmp_path / "hook").write_text("new-value")
    clock.now += 5
    assert files.read("hook") == SecretVersions(b"new-value", b"old-value")


def test_a_rewrite_seen_half_done_keeps_the_value_before_it_as_previous(tmp_path: Path) -> None:
    """`echo new > file` truncates, then writes: a read in between sees an empty file."""
    (tmp_path / "hook").write_text("old-value")
    files = SecretFiles(tmp_path, overlap_s=60, recheck_s=0, clock=Clock())
    (tmp_path / "hook").write_text("")
    assert files.read("hook") == SecretVersions(b"", b"old-value")
    (tmp_path / "hook").write_text("new-value")
    assert files.read("hook") == SecretVersions(b"new-value", b"old-value")


def test_a_missing_or_oversized_file_is_not_a_secret(tmp_path: Path) -> None:
    files = SecretFiles(tmp_path, recheck_s=0)
    assert files.read("absent") is None
    assert files.read("../etc") is None
    (tmp_path / "big").write_bytes(b"x" * (MAX_BYTES + 1))
    with pytest.raises(SecretUnavailable, match="over"):
        files.read("big")


def test_the_store_rotates_files_but_a_variable_is_fixed(tmp_path: Path) -> None:
    (tmp_path / "deploy-hook").write_text("old-value")
    env = {"EVENTOS_SECRETS_PURPOSES": "deploy-hook=webhook plain=webhook",
           "EVENTOS_SECRET_PLAIN": "from-env", "EVENTOS_SECRETS_RECHECK_S": "0"}  # fmt: skip
    store = SecretStore(env=env, directory=tmp_path)
    (tmp_path / "deploy-hook").write_text("new-value")
    assert store.versions("deploy-hook", "webhook") == SecretVersions(b"new-value", b"old-value")
    assert store.resolve("deploy-hook", "webhook") == b"new-value"
    assert store.versions("plain", "webhook") == SecretVersions(b"from-env")


def test_the_windows_are_bounded_settings() -> None:
    with pytest.raises(ConfigError, match="EVENTOS_SECRETS_OVERLAP_S"):
        SecretStore(env={"EVENTOS_SECRETS_OVERLAP_S": "-1"})
    with pytest.raises(ConfigError, match="EVENTOS_SECRETS_RECHECK_S"):
        SecretStore(env={"EVENTOS_SECRETS_RECHECK_S": "ten"})


def test_the_admin_token_file_rotates_with_an_overlap(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first-admin-token-0123456789\n")
    env = {"EVENTOS_ADMIN_TOKEN_FILE": str(path), "EVENTOS_SECRETS_RECHECK_S": "0",
           "EVENTOS_SECRETS_OVERLAP_S": "3600"}  # fmt: skip
    admin = AdminSettings.from_env(env)
    assert admin.tokens() == (b"first-admin-token-0123456789",)
    path.write_text("second-admin-token-0123456789")
    assert admin.tokens() == (b"second-admin-token-0123456789", b"first-admin-token-0123456789")
    path.write_text("short")  # a bad write is not taken as the token: the last good one stays
    assert admin.tokens() == (b"second-admin-token-0123456789",)
    path.write_text("third-admin-token-0123456789")  # the junk before it is no previous token
    assert admin.tokens() == (b"third-admin-token-0123456789",)
    path.unlink()
    assert admin.tokens() == (b"third-admin-token-0123456789",)


def test_an_unreadable_admin_token_file_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text("first-admin-token-0123456789")
    admin = AdminSettings.from_env({"EVENTOS_ADMIN_TOKEN_FILE": str(path),
                                    "EVENTOS_SECRETS_RECHECK_S": "0"})  # fmt: skip
    path.unlink()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert admin.tokens() == (b"first-admin-token-0123456789",)
    assert caplog.text.count("the last good admin token stays in use") == 1
    assert "first-admin-token" not in caplog.text


def test_the_admin_token_file_must_hold_a_token_at_boot(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="EVENTOS_ADMIN_TOKEN_FILE"):
        AdminSettings.from_env({"EVENTOS_ADMIN_TOKEN_FILE": str(tmp_path / "none")})
    (tmp_path / "short").write_text("short")
    with pytest.raises(ConfigError, match="at least 16"):
        AdminSettings.from_env({"EVENTOS_ADMIN_TOKEN_FILE": str(tmp_path / "short")})
