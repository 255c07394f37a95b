"""Send buckets (SPEC §11): a token per send from the account's bucket and the recipient's,
taken together or not at all, before the send is claimed.

A bucket refills continuously up to its size. A C4 send may use only the top half of a bucket,
so background sends never starve replies. A provider's 429 empties and pauses a bucket until
its retry hint has passed. No token → the wait until every bucket could give one; the caller
ends its attempt with that delay, holding nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from eventos import names
from eventos.channels.settings import Bucket
from eventos.db import Conn
from eventos.db.sql import Q


@dataclass(frozen=True)
class BucketRef:
    key: str  # `a:<account>` or `r:<driver>:<counterpart hash>`
    bucket: Bucket


def account_key(account_id: str) -> str:
    return f"a:{account_id}"


def recipient_key(driver: str, counterpart: str) -> str:
    return f"r:{driver}:{counterpart}"


def reserve(bucket: Bucket, klass: int) -> float:
    """Tokens a class must leave in the bucket: half of it for C4 (at least the last token)."""
    if klass < names.C4_BACKGROUND:
        return 0.0
    return min(bucket.burst / 2, bucket.burst - 1)


def wait_for(level: float, bucket: Bucket, klass: int) -> float:
    """Seconds until the bucket holds a token above the class's reserve (0: now)."""
    need = reserve(bucket, klass) + 1
    return 0.0 if level >= need else (need - level) / bucket.rate


async def take(conn: Conn, refs: list[BucketRef], klass: int) -> float:
    """Take one token from every bucket, or none; returns the wait (0 when taken)."""
    levels: list[tuple[BucketRef, float, float]] = []
    async with conn.transaction():
        for ref in sorted(refs, key=lambda r: r.key):  # one lock order: no deadlock
            cur = await conn.execute(Q["egress_bucket_open"],
                                     {"key": ref.key, "burst": ref.bucket.burst})  # fmt: skip
            row = await cur.fetchone()
            assert row is not None  # the upsert returns its row
            paused = float(row["paused_s"] or 0.0)
            level = (
                0.0
                if paused > 0
                else min(
                    ref.bucket.burst,
                    float(row["tokens"]) + float(row["elapsed_s"]) * ref.bucket.rate,
                )
            )
            levels.append((ref, level, paused))
        wait = max(max(paused, wait_for(level, ref.bucket, klass)) for ref, level, paused in levels)
        for ref, level, _ in levels:
            left = level - 1 if wait == 0 else level
            await conn.execute(Q["egress_bucket_save"], {"key": ref.key, "tokens": left})
    return wait


async def pause(conn: Conn, key: str, pause_s: float) -> None:
    """A provider's rate limit: the bucket gives nothing for `pause_s`."""
    await conn.execute(Q["egress_bucket_pause"], {"key": key, "pause_s": pause_s})
