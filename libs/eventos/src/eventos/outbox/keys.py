"""The keys that seal outbox recipients at rest (SPEC §11 "recipient (encrypted)").

AES-256-GCM with a 12-byte random nonce per seal. The associated data binds the key id, the
employee and the row's idempotency key, so a ciphertext copied onto another row (or relabelled
with another key id) does not open. `EVENTOS_OUTBOX_KEYS` (or the file `EVENTOS_OUTBOX_KEYS_FILE`)
lists `<key id>:<base64 of 32 bytes>` entries: the first seals, every one opens (rotation).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from eventos.errors import ConfigError, RecipientUnreadable
from eventos.settings import OUTBOX_KEYS_FILE_VAR, OUTBOX_KEYS_VAR, OutboxKeySettings

VAR, FILE_VAR = OUTBOX_KEYS_VAR, OUTBOX_KEYS_FILE_VAR
KEY_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
KEY_BYTES = 32
NONCE_BYTES = 12
_AAD_PREFIX = b"eventos/outbox/recipient/v1"


@dataclass(frozen=True)
class Sealed:
    """A recipient as stored: the key id and nonce ‖ ciphertext ‖ tag."""

    key_id: str
    blob: bytes = field(repr=False)


def _aad(key_id: str, employee: str, idempotency_key: str) -> bytes:
    return b"\x00".join([_AAD_PREFIX, *(s.encode() for s in (key_id, employee, idempotency_key))])


def new_key_entry(key_id: str) -> str:
    """A fresh `<key id>:<base64>` entry (what `make run` and the tests generate)."""
    return f"{key_id}:{base64.b64encode(os.urandom(KEY_BYTES)).decode()}"


def _parse_entry(entry: str, var: str) -> tuple[str, bytes]:
    key_id, sep, encoded = entry.partition(":")
    key_id = key_id.strip()
    if not sep or not KEY_ID_RE.match(key_id):
        raise ConfigError(f"{var}: each entry must be <key id>:<base64 of 32 bytes>, "
                          f"the key id matching {KEY_ID_RE.pattern}")  # fmt: skip
    try:
        key = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{var}: key {key_id!r} is not valid base64") from None
    if len(key) != KEY_BYTES:
        raise ConfigError(f"{var}: key {key_id!r} must be {KEY_BYTES} bytes, got {len(key)}")
    return key_id, key


@dataclass(frozen=True)
class OutboxKeys:
    """The recipient keys, in order: the first seals, every one opens."""

    keys: tuple[tuple[str, bytes], ...] = field(repr=False)
    source: str = VAR

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError(f"{self.source} lists no key")

    def __repr__(self) -> str:
        return f"OutboxKeys(ids={self.key_ids!r}, source={self.source!r})"

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.keys)

    @classmethod
    def parse(cls, text: str, var: str = VAR) -> OutboxKeys:
        """Keys from `<id>:<base64>` entries separated by commas or newlines."""
        entries = [e for e in re.split(r"[,\n]", text) if e.strip()]
        keys = tuple(_parse_entry(e, var) for e in entries)
        ids = [k for k, _ in keys]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"{var}: a key id is listed twice")
        return cls(keys, var)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OutboxKeys:
        """Read once at boot; fails naming the variable when neither is set or one is bad."""
        found = OutboxKeySettings.from_env(env)
        return cls.parse(found.text, found.source)

    def seal(self, recipient: str, *, employee: str, idempotency_key: str) -> Sealed:
        """Encrypt a recipient under the first key, bound to its row."""
        key_id, key = self.keys[0]
        nonce = os.urandom(NONCE_BYTES)
        aad = _aad(key_id, employee, idempotency_key)
        return Sealed(key_id, nonce + AESGCM(key).encrypt(nonce, recipient.encode(), aad))

    def open(self, sealed: Sealed, *, employee: str, idempotency_key: str) -> str:
        """The recipient, or RecipientUnreadable naming why (never the ciphertext)."""
        key = dict(self.keys).get(sealed.key_id)
        if key is None:
            raise RecipientUnreadable(
                f"the recipient was sealed with key {sealed.key_id!r}, which {self.source} "
                f"does not list (it lists {', '.join(self.key_ids)})"
            )
        nonce, body = sealed.blob[:NONCE_BYTES], sealed.blob[NONCE_BYTES:]
        try:
            plain = AESGCM(key).decrypt(nonce, body, _aad(sealed.key_id, employee, idempotency_key))
        except (InvalidTag, ValueError):
            raise RecipientUnreadable(
                f"the recipient sealed with key {sealed.key_id!r} does not authenticate: "
                "the ciphertext was altered or belongs to another row"
            ) from None
        return plain.decode()
