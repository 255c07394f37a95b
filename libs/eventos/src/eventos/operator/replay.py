"""Replay (the bus contract `replay(selector)`, SPEC §5): dead letters routed once more.

Operator-confirmed in two calls. The first evaluates a selector (ids, or reason, source,
employee, time range; at most 1,000 letters) and answers what it would replay with a
confirmation: an HMAC, under a key made once per instance, over the sorted letter ids, the
database time it was issued and its expiry (10 minutes). The second call sends the same selector
with the confirmation: the selector is evaluated again as of the issue time (letters dead by
then and not replayed by then), and only when the MAC of that set matches are its letters
replayed; a tampered, expired or outdated confirmation is refused.

A replay appends each letter again as a new ingress row in its source, under the dedupe key
`replay:<letter>`, naming the letter (`replay_of`), copied inside the database. A dead ingress
row routes as it was never routed. A dead delivery goes back to the one trigger it died in, in
its employee's live generation (`replay_employee`, `replay_trigger`), never to the other
subscribers of its source: they had their delivery. Each letter is claimed by compare-and-swap
(`replayed_at` set where it was NULL), so a letter is replayed once, whatever confirmations,
overlapping selectors or attention actions name it again; those say what was replayed before.
An owner's chat message follows its input: queued again, so its reply shows on it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict, InputInvalid
from eventos.operator import dead_letters
from eventos.operator.dead_letters import Letters
from eventos.operator.pages import parse_time

SELECT_MAX = 1000  # letters one replay may take
SAMPLE = 10
CONFIRM_TTL = timedelta(minutes=10)
KEY_NAME = "replay_key"
KEY_BYTES = 32
TOKEN_VERSION = "v1"
TEXT_MAX = 200
SELECTOR_KEYS = ("ids", "reason", "source", "employee", "since", "until")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CONFIRMATION = "confirmation"


@dataclass(frozen=True)
class Preview:
    """What a selector would replay now, and the confirmation that replays exactly that."""

    count: int
    sample: list[dict[str, Any]]
    already_replayed: int  # letters the selector matches that were replayed before
    confirmation: str | None  # None: nothing to replay
    expires_at: datetime | None


@dataclass(frozen=True)
class Replayed:
    """What a replay did: each letter replayed with its new ingress row, and the letters it
    was asked for that had been replayed before (nothing is replayed twice)."""

    replays: list[tuple[str, int]]
    already: list[str]


def _text(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is not None and (not isinstance(value, str) or not 0 < len(value) <= TEXT_MAX):
        raise InputInvalid(f"selector.{key}", f"must be a string of 1..{TEXT_MAX} characters")
    return value


def _ids(value: object) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not 0 < len(value) <= SELECT_MAX:
        raise InputInvalid("selector.ids", f"must be a list of 1..{SELECT_MAX} dead letter ids")
    for letter in value:
        dead_letters.parse_id(letter, "selector.ids")
    return list(value)


def selector(doc: object) -> Letters:
    """The letters a selector document names (InputInvalid on the first bad field)."""
    if not isinstance(doc, dict):
        raise InputInvalid("selector", "must be an object")
    unknown = sorted(set(doc) - set(SELECTOR_KEYS))
    if unknown:
        raise InputInvalid(f"selector.{unknown[0]}", f"unknown; use {', '.join(SELECTOR_KEYS)}")
    if all(doc.get(k) is None for k in SELECTOR_KEYS):
        raise InputInvalid("selector", f"give at least one of {', '.join(SELECTOR_KEYS)}")
    reason = _text(doc, "reason")
    if reason is not None and reason not in dead_letters.REASONS:
        raise InputInvalid("selector.reason", f"must be one of {', '.join(dead_letters.REASONS)}")
    return Letters(reason=reason, source=_text(doc, "source"), employee=_text(doc, "employee"),
                   since=parse_time("selector.since", _text(doc, "since")),
                   until=parse_time("selector.until", _text(doc, "until")),
                   ids=_ids(doc.get("ids")))  # fmt: skip


def _micros(when: datetime) -> int:
    return (when - EPOCH) // timedelta(microseconds=1)


def _mac(key: bytes, letters: list[str], issued_us: int, expires_us: int) -> bytes:
    text = "\n".join([TOKEN_VERSION, str(issued_us), str(expires_us), *sorted(letters)])
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _token(key: bytes, letters: list[str], issued_at: datetime) -> tuple[str, datetime]:
    issued = _micros(issued_at)
    expires = issued + CONFIRM_TTL // timedelta(microseconds=1)
    mac = base64.urlsafe_b64encode(_mac(key, letters, issued, expires)).decode().rstrip("=")
    return f"{TOKEN_VERSION}.{issued}.{expires}.{mac}", EPOCH + timedelta(microseconds=expires)


def _parse(token: object) -> tuple[int, int, bytes]:
    """A confirmation's issue time and expiry (µs since the epoch) and its MAC."""
    parts = token.split(".") if isinstance(token, str) and len(token) <= TEXT_MAX else []
    try:
        version, issued, expires, mac = parts
        if version != TOKEN_VERSION or not (issued.isdigit() and expires.isdigit()):
            raise ValueError(version)
        raw = base64.urlsafe_b64decode(mac + "=" * (-len(mac) % 4))
        if len(raw) != hashlib.sha256().digest_size or len(issued) > 18 or len(expires) > 18:
            raise ValueError(mac)
    except (ValueError, binascii.Error):
        raise InputInvalid(CONFIRMATION, "is not a confirmation this instance gave") from None
    return int(issued), int(expires), raw


async def _clock(conn: Conn) -> datetime:
    row = await (await conn.execute(Q["replay_clock"])).fetchone()
    assert row is not None
    return row["now"]  # type: ignore[no-any-return]


async def _key(conn: Conn) -> bytes:
    """The instance's confirmation key, made on first use (every replica reads the same)."""
    params = {"name": KEY_NAME, "value": os.urandom(KEY_BYTES)}
    await conn.execute(Q["instance_secret_create"], params)
    row = await (await conn.execute(Q["instance_secret_get"], {"name": KEY_NAME})).fetchone()
    if row is None:  # unreachable: the row was created above or already existed
        raise RuntimeError("the replay key was not stored")
    return bytes(row["value"])


def _names(rows: list[dict[str, Any]]) -> list[str]:
    return [dead_letters.letter_id(r["kind"], int(r["id"])) for r in rows]


async def preview(conn: Conn, letters: Letters) -> Preview:
    """What `letters` would replay now (InputInvalid past SELECT_MAX), with its confirmation."""
    async with conn.transaction():
        now = await _clock(conn)
        rows = await dead_letters.matching(conn, letters, as_of=now, cap=SELECT_MAX + 1)
        if len(rows) > SELECT_MAX:
            raise InputInvalid("selector", f"matches more than {SELECT_MAX} dead letters; "
                               "narrow it (reason, source, employee, since, until)")  # fmt: skip
        done = await dead_letters.matching(conn, replace(letters, replayed=True), as_of=None,
                                           cap=SELECT_MAX + 1)  # fmt: skip
        token, expires = _token(await _key(conn), _names(rows), now) if rows else (None, None)
    sample = [dead_letters.view(r) for r in rows[:SAMPLE]]
    return Preview(len(rows), sample, len(done), token, expires)


async def confirm(conn: Conn, letters: Letters, token: object) -> Replayed:
    """Replay what the preview of `letters` showed, if `token` confirms exactly that set."""
    issued, expires, mac = _parse(token)
    async with conn.transaction():
        now = await _clock(conn)
        if _micros(now) > expires:
            at = (EPOCH + timedelta(microseconds=expires)).isoformat()
            raise Conflict(f"the confirmation expired at {at}; ask again without one")
        as_of = EPOCH + timedelta(microseconds=issued)
        rows = await dead_letters.matching(conn, letters, as_of=as_of, cap=SELECT_MAX + 1)
        if not hmac.compare_digest(_mac(await _key(conn), _names(rows), issued, expires), mac):
            raise Conflict("the confirmation does not match the dead letters this selector "
                           "matched (altered, or given for another selector); ask again "
                           "without one")  # fmt: skip
        return await replay_letters(conn, _names(rows))


async def replay_letters(conn: Conn, letters: list[str]) -> Replayed:
    """Replay these letters (those not replayed yet) in one transaction; see the module."""
    by_kind: dict[str, list[int]] = {k: [] for k in dead_letters.KINDS}
    for kind, number in map(dead_letters.parse_id, letters):
        by_kind[kind].append(number)
    async with conn.transaction():
        claimed = await _claim(conn, "replay_claim_ingress", by_kind[names.LETTER_INGRESS])
        taken = await _claim(conn, "replay_claim_deliveries", by_kind[names.LETTER_DELIVERY])
        sources = sorted({str(r["source_key"]) for r in [*claimed, *taken]})
        if not sources:
            return Replayed([], list(letters))
        await conn.execute(Q["ingress_source_append_lock"], {"sources": sources})
        cur = await conn.execute(Q["replay_append"], {
            "ingress_ids": [r["id"] for r in claimed], "delivery_ids": [r["id"] for r in taken],
            "ttl_s": names.DEDUPE_TTL_DAYS * 86400,
        })  # fmt: skip
        made = await cur.fetchall()
        if len(made) != len(claimed) + len(taken):  # unreachable: a letter is claimed once
            raise RuntimeError("a replay's dedupe key was taken; nothing was replayed")
        await _link(conn, made)
    replays = [(str(r["letter"]), int(r["new_id"])) for r in made]
    done = {letter for letter, _ in replays}
    return Replayed(replays, [letter for letter in letters if letter not in done])


async def _claim(conn: Conn, query: str, ids: list[int]) -> list[dict[str, Any]]:
    if not ids:
        return []
    cur = await conn.execute(Q[query], {"ids": ids})
    return list(await cur.fetchall())


async def _link(conn: Conn, made: list[dict[str, Any]]) -> None:
    """Each letter names its replay; owner messages follow theirs."""
    for kind, query in ((names.LETTER_INGRESS, "replay_mark_ingress"),
                        (names.LETTER_DELIVERY, "replay_mark_deliveries")):  # fmt: skip
        mine = [r for r in made if str(r["letter"]).startswith(kind + "-")]
        ids = [dead_letters.parse_id(r["letter"])[1] for r in mine]
        await conn.execute(Q[query], {"ids": ids, "new_ids": [r["new_id"] for r in mine]})
    await conn.execute(Q["replay_chat_messages"], {
        "ids": [r["original_ingress"] for r in made], "new_ids": [r["new_id"] for r in made],
    })  # fmt: skip
