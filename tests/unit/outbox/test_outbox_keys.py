"""Outbox recipient keys (EVENTOS_OUTBOX_KEYS): parsing, sealing bound to a row, rotation, and
the services that refuse to start without one."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventos.errors import ConfigError, RecipientUnreadable
from eventos.outbox.keys import FILE_VAR, VAR, OutboxKeys, Sealed, new_key_entry

ROW = {"employee": "support", "idempotency_key": "k-1"}
OTHER_ROW = {"employee": "support", "idempotency_key": "k-2"}


def test_a_sealed_recipient_opens_only_on_its_own_row() -> None:
    keys = OutboxKeys.parse(new_key_entry("k1"))
    sealed = keys.seal("+49 151 2345678", **ROW)
    assert sealed.key_id == "k1"
    assert b"2345678" not in sealed.blob and len(sealed.blob) == 12 + len("+49 151 2345678") + 16
    assert keys.open(sealed, **ROW) == "+49 151 2345678"
    assert keys.seal("+49 151 2345678", **ROW).blob != sealed.blob  # a fresh nonce each time
    with pytest.raises(RecipientUnreadable, match="another row"):
        keys.open(sealed, **OTHER_ROW)
    with pytest.raises(RecipientUnreadable, match="another row"):
        keys.open(sealed, employee="billing", idempotency_key="k-1")


def test_a_tampered_ciphertext_or_an_unknown_key_id_fails_clearly() -> None:
    keys = OutboxKeys.parse(new_key_entry("k1"))
    sealed = keys.seal("alice@example.com", **ROW)
    flipped = bytearray(sealed.blob)
    flipped[-1] ^= 1
    with pytest.raises(RecipientUnreadable, match="altered") as caught:
        keys.open(Sealed("k1", bytes(flipped)), **ROW)
    assert "alice" not in str(caught.value)
    with pytest.raises(RecipientUnreadable, match=r"key 'k0', which EVENTOS_OUTBOX_KEYS does not"):
        keys.open(Sealed("k0", sealed.blob), **ROW)
    with pytest.raises(RecipientUnreadable):
        keys.open(Sealed("k1", b"short"), **ROW)


def test_rotation_the_first_key_seals_and_every_key_opens() -> None:
    old_entry, new_entry = new_key_entry("2025"), new_key_entry("2026")
    old = OutboxKeys.parse(old_entry)
    sealed_before = old.seal("alice@example.com", **ROW)
    # Step 1: the new key is added last everywhere (opens only); step 2: it moves first.
    added = OutboxKeys.parse(f"{old_entry},{new_entry}")
    assert added.seal("x", **ROW).key_id == "2025"
    rotated = OutboxKeys.parse(f"{new_entry}, {old_entry}")
    assert rotated.seal("x", **ROW).key_id == "2026"
    assert rotated.open(sealed_before, **ROW) == "alice@example.com"
    # Step 3: the old key is dropped; what it sealed no longer opens.
    with pytest.raises(RecipientUnreadable, match="2025"):
        OutboxKeys.parse(new_entry).open(sealed_before, **ROW)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "lists no key"),
        ("k1", "<key id>:<base64"),
        ("bad id:" + base64.b64encode(os.urandom(32)).decode(), "<key id>:<base64"),
        ("k1:not base64!", "not valid base64"),
        ("k1:" + base64.b64encode(os.urandom(16)).decode(), "must be 32 bytes, got 16"),
        (f"{new_key_entry('k1')},{new_key_entry('k1')}", "listed twice"),
    ],
    ids=["empty", "no-key", "bad-id", "not-base64", "short-key", "twice"],  # the keys are random
)
def test_bad_keys_fail_naming_the_variable(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        OutboxKeys.parse(value)
    assert str(caught.value).startswith(VAR)


def test_from_env_reads_the_variable_or_the_file(tmp_path: Path) -> None:
    entry = new_key_entry("k1")
    assert OutboxKeys.from_env({VAR: entry}).key_ids == ("k1",)
    path = tmp_path / "keys"
    path.write_text(f"{new_key_entry('k2')}\n{entry}\n")
    from_file = OutboxKeys.from_env({FILE_VAR: str(path)})
    assert from_file.key_ids == ("k2", "k1")
    assert entry.partition(":")[2] not in repr(from_file)
    with pytest.raises(ConfigError, match=f"{VAR} .or {FILE_VAR}. is required"):
        OutboxKeys.from_env({})
    with pytest.raises(ConfigError, match="not both"):
        OutboxKeys.from_env({VAR: entry, FILE_VAR: str(path)})
    with pytest.raises(ConfigError, match=f"{FILE_VAR}: cannot read"):
        OutboxKeys.from_env({FILE_VAR: str(tmp_path / "missing")})


@pytest.mark.parametrize("module", ["eventos_egress", "eventos_workers_workflow", "eventos_relay"])
def test_services_that_seal_or_open_recipients_refuse_to_start_without_a_key(module: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTOS_OUTBOX_KEYS")}
    env["EVENTOS_DATABASE_URL"] = "postgresql://nowhere.invalid/eventos"
    done = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert f"ConfigError: {VAR} (or {FILE_VAR}) is required" in done.stderr
