"""Users and audiences (SPEC §6.2, §17 "Users and audiences", EG3).

The admin token (one per instance) may do everything and chats as the audience `owner`, on the
talk lane's thread `main` (which also holds webhook, cron and poll inputs). A user's token may
chat, read its own messages and follow its own event stream; its owner chat is its own
conversation, on its own thread, which only its own chat messages reach. A token is shown once;
the database keeps its sha256 (a 256-bit random token needs no slow hash).

A user is the owner's guest: its chat runs at class C2 unless the admin granted C1 (and never in
the owner's reserved slot), within a daily spend cap per employee (`daily_usd`, else
`names.USER_DAILY_SHARE` of the employee's daily budget) and `names.OWNER_CHAT_PENDING_MAX`
pending messages over all its sessions. Each user record has its own id: its thread derives from
it, and what a user reads starts at its record's creation, so a name removed and created again
starts a new conversation and never sees the old holder's.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict, InputInvalid, NotFound

OWNER = "owner"  # the admin's audience
NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
TOKEN_PREFIX = "eos_u_"  # tells a user token from the admin's without a database call
TOKEN_BYTES = 32
THREAD_PREFIX = names.USER_THREAD_PREFIX
THREAD_SALT = b"eventos.user-id:"
LEGACY_THREAD_SALT = b"eventos.user:"  # threads of users made before records had ids (0027)
CLASSES = {"c1": names.C1_OWNER, "c2": names.C2_CUSTOMER}  # what the admin may grant
DAILY_USD_MAX = Decimal(100_000)
DAILY_USD_STEP = Decimal("0.0001")  # the column's scale: numeric(12, 4)


@dataclass(frozen=True)
class Created:
    """A new user and its token (shown this once)."""

    name: str
    token: str
    klass: int
    daily_usd: Decimal | None
    id: str


@dataclass(frozen=True)
class User:
    """A user record as a token finds it."""

    name: str
    id: str
    thread: str
    klass: int
    daily_usd: Decimal | None
    created_at: datetime


def thread_of(user_id: str) -> str:
    """A user's owner-chat thread: `u_` and 16 hex of a salted hash of its record's id (no
    name in ids, and a re-created name gets a new one)."""
    return THREAD_PREFIX + hashlib.sha256(THREAD_SALT + user_id.encode()).hexdigest()[:16]


def legacy_thread_of(name: str) -> str:
    """The thread a user's name gave before records had ids (a message accepted then)."""
    return THREAD_PREFIX + hashlib.sha256(LEGACY_THREAD_SALT + name.encode()).hexdigest()[:16]


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def check_name(name: str) -> str:
    """A valid user name, or InputInvalid on `name`."""
    if not NAME_RE.match(name):
        raise InputInvalid("name", f"must match {NAME_RE.pattern}")
    return name


def class_of(value: object) -> int:
    """The class a `class` field grants: `c1` or `c2` (the default); else InputInvalid."""
    if value is None:
        return names.C2_CUSTOMER
    if not isinstance(value, str) or value.lower() not in CLASSES:
        raise InputInvalid("class", "must be c1 or c2")
    return CLASSES[value.lower()]


def daily_usd_of(value: object) -> Decimal | None:
    """A `daily_usd` field: a positive number of dollars, or None (the default share)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputInvalid("daily_usd", "must be a positive number")
    try:
        usd = Decimal(str(value))
    except InvalidOperation:
        raise InputInvalid("daily_usd", "must be a positive number") from None
    if not usd.is_finite() or usd > DAILY_USD_MAX:
        raise InputInvalid("daily_usd", f"must be above 0 and at most {DAILY_USD_MAX}")
    usd = usd.quantize(DAILY_USD_STEP)  # as stored: numeric(12, 4)
    if usd <= 0:  # 0.00001 rounds to nothing, which the table refuses (CHECK daily_usd > 0)
        raise InputInvalid("daily_usd", f"must be at least {DAILY_USD_STEP}")
    return usd


async def create(conn: Conn, name: str, klass: int = names.C2_CUSTOMER,
                 daily_usd: Decimal | None = None) -> Created:  # fmt: skip
    """A new user with a fresh token; Conflict when the name is taken (`owner` always is)."""
    check_name(name)
    if name == OWNER:
        raise Conflict(f"{OWNER!r} is the admin's audience")
    token = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
    user_id = str(uuid.uuid4())
    params = {"id": user_id, "name": name, "thread": thread_of(user_id), "class": klass,
              "token_sha256": token_digest(token), "daily_usd": daily_usd}  # fmt: skip
    cur = await conn.execute(Q["user_insert"], params)
    if await cur.fetchone() is None:
        raise Conflict(f"a user {name!r} exists")
    return Created(name, token, klass, daily_usd, user_id)


async def list_all(conn: Conn) -> list[dict[str, Any]]:
    """Every user: {id, name, class, daily_usd, created_at}."""
    cur = await conn.execute(Q["user_list"])
    return await cur.fetchall()


async def remove(conn: Conn, name: str) -> None:
    """Remove a user; its token stops working at once. Its history stays (the admin's to
    read); adding the same name again makes a new user with a new conversation."""
    cur = await conn.execute(Q["user_delete"], {"name": name})
    if await cur.fetchone() is None:
        raise NotFound(f"no user {name!r}")


async def by_token(conn: Conn, token: str) -> User | None:
    """The user holding `token`, else None. The lookup is by the token's sha256, so its
    timing says nothing about how much of a guess was right."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    cur = await conn.execute(Q["user_by_token"], {"token_sha256": token_digest(token)})
    row = await cur.fetchone()
    if row is None:
        return None
    return User(str(row["name"]), str(row["id"]), str(row["thread"]), int(row["class"]),
                row["daily_usd"], row["created_at"])  # fmt: skip
