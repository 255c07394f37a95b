"""Customer thread ids (issue 14): `t_<hash>` of a counterpart under a per-instance salt.

A thread id travels everywhere an id does (stream keys, workflow ids, metrics, logs), so it must
not let anyone recover a phone number or a user id: it is an HMAC of the channel, the account
and the counterpart's address under a salt made once per instance and kept in the database.
The same hash keys a recipient's egress bucket.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from eventos.db import Conn
from eventos.db.sql import Q

SALT_NAME = "thread_salt"
SALT_BYTES = 32
THREAD_PREFIX = "t_"
HASH_HEX = 32  # 128 bits: no collision among any instance's counterparts


async def instance_salt(conn: Conn) -> bytes:
    """The instance's salt, made on first use (every replica reads the same one)."""
    params = {"name": SALT_NAME, "value": os.urandom(SALT_BYTES)}
    await conn.execute(Q["instance_secret_create"], params)
    cur = await conn.execute(Q["instance_secret_get"], {"name": SALT_NAME})
    row = await cur.fetchone()
    if row is None:  # unreachable: the row was created above or already existed
        raise RuntimeError("the instance salt was not stored")
    return bytes(row["value"])


def counterpart_hash(salt: bytes, driver: str, account: str, address: str) -> str:
    """A stable, unrecoverable name of one counterpart of one account."""
    msg = "\x00".join((driver, account, address)).encode("utf-8", "surrogatepass")
    return hmac.new(salt, msg, hashlib.sha256).hexdigest()[:HASH_HEX]


def thread_id(salt: bytes, driver: str, account: str, address: str) -> str:
    """The customer thread of a chat (a person, or a group as a whole)."""
    return THREAD_PREFIX + counterpart_hash(salt, driver, account, address)
