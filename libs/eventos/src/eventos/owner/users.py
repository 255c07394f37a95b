"""Users and audiences (SPEC §6.2, §17 "Users and audiences", EG3).

The admin token (one per instance) may do everything and chats as the audience `owner`, on the
talk lane's thread `main` (which also holds webhook, cron and poll inputs). A user's token may
chat, read its own messages and follow its own event stream; its owner chat is its own
conversation, on its own thread, which only its own chat messages reach. A token is shown once;
the database keeps its sha256 (a 256-bit random token needs no slow hash).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict, InputInvalid, NotFound

OWNER = "owner"  # the admin's audience
NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
TOKEN_PREFIX = "eos_u_"  # tells a user token from the admin's without a database call
TOKEN_BYTES = 32
THREAD_PREFIX = "u_"
THREAD_SALT = b"eventos.user:"


@dataclass(frozen=True)
class Created:
    """A new user and its token (shown this once)."""

    name: str
    token: str


def thread_of(name: str) -> str:
    """The user's owner-chat thread: `u_` and 16 hex of a salted hash (no name in ids)."""
    return THREAD_PREFIX + hashlib.sha256(THREAD_SALT + name.encode()).hexdigest()[:16]


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def check_name(name: str) -> str:
    """A valid user name, or InputInvalid on `name`."""
    if not NAME_RE.match(name):
        raise InputInvalid("name", f"must match {NAME_RE.pattern}")
    return name


async def create(conn: Conn, name: str) -> Created:
    """A new user with a fresh token; Conflict when the name is taken (`owner` always is)."""
    check_name(name)
    if name == OWNER:
        raise Conflict(f"{OWNER!r} is the admin's audience")
    token = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
    params = {"name": name, "thread": thread_of(name), "token_sha256": token_digest(token)}
    cur = await conn.execute(Q["user_insert"], params)
    if await cur.fetchone() is None:
        raise Conflict(f"a user {name!r} exists")
    return Created(name, token)


async def list_all(conn: Conn) -> list[dict[str, Any]]:
    """Every user: {name, created_at}."""
    cur = await conn.execute(Q["user_list"])
    return await cur.fetchall()


async def remove(conn: Conn, name: str) -> None:
    """Remove a user; its token stops working at once. Its history stays: adding the same name
    again gives a new token to the same audience."""
    cur = await conn.execute(Q["user_delete"], {"name": name})
    if await cur.fetchone() is None:
        raise NotFound(f"no user {name!r}")


async def by_token(conn: Conn, token: str) -> str | None:
    """The name of the user holding `token`, else None. The lookup is by the token's sha256,
    so its timing says nothing about how much of a guess was right."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    cur = await conn.execute(Q["user_by_token"], {"token_sha256": token_digest(token)})
    row = await cur.fetchone()
    return None if row is None else str(row["name"])
