"""Dead letters (SPEC §5, §8, §15): what the bus settled `dead`, read as one list.

Two things die: an ingress row that could not be routed (`malformed`, `filter_error`,
`placement_invalid`, `loop_suppressed`, a channel's unreadable update, …) and a delivery whose
input was never consumed (`reset`, `rejected` by Temporal five times, `turn_failed` twice,
`parked` for 7 days). Each letter is named `<kind>-<id>` (`ingress-12`, `delivery-7`) and shows
its reason's code (the `eventos_dead_letters_total` label), the stored reason, its source and,
where known, its employee and stream. It never shows content: its preview is the event's type,
size and the key names of its data.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import InputInvalid
from eventos.operator.pages import decode_cursor, encode_cursor
from eventos.runtime.metrics import DEAD_REASONS

REASONS = (*sorted(DEAD_REASONS), "other")
KINDS = (names.LETTER_INGRESS, names.LETTER_DELIVERY)
ID_MAX_DIGITS = 18


@dataclass(frozen=True)
class Letters:
    """Which dead letters: every field narrows (None: any)."""

    reason: str | None = None  # a code of REASONS
    source: str | None = None  # a source key (`webhook:stripe`) or its kind (`webhook`)
    employee: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    replayed: bool | None = None
    ids: list[str] | None = None  # letter ids (`ingress-12`, `delivery-7`)

    def __post_init__(self) -> None:
        if self.reason is not None and self.reason not in REASONS:
            raise InputInvalid("reason", f"must be one of {', '.join(REASONS)}")
        for letter in self.ids or []:
            parse_id(letter)

    def params(self) -> dict[str, Any]:
        """The query parameters of these filters."""
        by_kind: dict[str, list[int]] = {k: [] for k in KINDS}
        for kind, number in map(parse_id, self.ids or []):
            by_kind[kind].append(number)
        return {
            "reasons": list(DEAD_REASONS), "reason": self.reason, "source": self.source,
            "employee": self.employee, "since": self.since, "until": self.until,
            "replayed": self.replayed, "by_ids": self.ids is not None,
            "ingress_ids": by_kind[names.LETTER_INGRESS],
            "delivery_ids": by_kind[names.LETTER_DELIVERY],
        }  # fmt: skip


def letter_id(kind: str, number: int) -> str:
    """A letter's name, `<kind>-<id>`."""
    return f"{kind}-{number}"


def parse_id(letter: object, path: str = "ids") -> tuple[str, int]:
    """The kind and number of a letter's name (InputInvalid on `path` otherwise)."""
    kind, _, number = str(letter).partition("-")
    if (not isinstance(letter, str) or kind not in KINDS or not number.isascii()
            or not number.isdigit() or len(number) > ID_MAX_DIGITS):  # fmt: skip
        raise InputInvalid(path, f"{str(letter)[:40]!r} is not a dead letter id "
                                 "(ingress-<n> or delivery-<n>)")  # fmt: skip
    return kind, int(number)


def preview(row: dict[str, Any]) -> str:
    """What the event was, without its content: type, size and its data's key names."""
    text = f"{row['type']}, {row['size']} bytes"
    keys = row.get("data_keys")
    return f"{text}, data: {', '.join(keys)}" if keys else text


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def view(row: dict[str, Any]) -> dict[str, Any]:
    """A letter as the API shows it."""
    return {
        "id": letter_id(row["kind"], int(row["id"])), "kind": row["kind"],
        "reason": row["reason"], "detail": row["detail"], "source": row["source"],
        "at": row["at"].isoformat(), "employee": row["employee"], "stream": row["stream"],
        "type": row["type"], "size": row["size"], "preview": preview(row),
        "chain_id": row["chain_id"], "replay_of": row["replay_of"],
        "replayed_at": _iso(row["replayed_at"]), "replayed_as": row["replayed_as"],
        "turn_id": row.get("turn_id"),
    }  # fmt: skip


async def _select(conn: Conn, letters: Letters, *, limit: int, as_of: datetime | None = None,
                  after: list[str | int] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    at, kind, number = after if after is not None else (None, None, None)
    params = {**letters.params(), "as_of": as_of, "limit": limit,
              "after_at": None if at is None else datetime.fromisoformat(str(at)),
              "after_kind": kind, "after_id": number}  # fmt: skip
    cur = await conn.execute(Q["dead_letters_list"], params)
    return list(await cur.fetchall())


def _after(raw: str | None) -> list[str | int] | None:
    key = decode_cursor(raw, (str, str, int))
    if key is not None:
        try:
            datetime.fromisoformat(str(key[0]))
        except ValueError:
            raise InputInvalid("cursor", "is not a cursor this list gave") from None
    return key


async def page(conn: Conn, letters: Letters, *, limit: int,
               cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:  # fmt: skip
    """One page of letters, newest first, and the cursor of the next (None: the last page)."""
    rows = await _select(conn, letters, limit=limit + 1, after=_after(cursor))
    more = len(rows) > limit
    rows = rows[:limit]
    following = None
    if more:
        last = rows[-1]
        following = encode_cursor([last["at"].isoformat(), last["kind"], int(last["id"])])
    return [view(r) for r in rows], following


async def matching(conn: Conn, letters: Letters, *, as_of: datetime | None,
                   cap: int) -> list[dict[str, Any]]:  # fmt: skip
    """Up to `cap` letters, newest first; with `as_of`, those dead at that time and not
    replayed by then."""
    return await _select(conn, letters, limit=cap, as_of=as_of)
