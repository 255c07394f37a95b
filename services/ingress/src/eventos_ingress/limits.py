"""Per-source rate limits and unrouted-backlog high water (SPEC §15)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from eventos.db import Conn
from eventos.db.sql import Q

# (rate per second, burst, unrouted high water) per kind of webhook source.
SIGNED_LIMITS = (50.0, 100.0, 10_000)
GENERIC_LIMITS = (10.0, 20.0, 1_000)
BACKLOG_CACHE_S = 1.0


@dataclass
class TokenBucket:
    """Tokens refill at `rate` per second up to `burst`."""

    rate: float
    burst: float
    tokens: float = -1.0
    stamp: float = 0.0

    def take(self, now: float) -> float:
        """0 when a token was taken, else the seconds until one is free."""
        if self.tokens < 0:
            self.tokens, self.stamp = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass
class SourceLimits:
    """Rate buckets and cached backlog counts per source key (one ingress replica's view)."""

    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    backlog: dict[str, tuple[float, int]] = field(default_factory=dict)

    def retry_after(self, source: str, rate: float, burst: float) -> int:
        """Seconds to wait (0 = go ahead)."""
        bucket = self.buckets.setdefault(source, TokenBucket(rate, burst))
        wait = bucket.take(time.monotonic())
        return 0 if wait == 0 else max(1, math.ceil(wait))

    async def over_high_water(self, conn: Conn, source: str, high_water: int) -> bool:
        """Whether the source's unrouted backlog has reached its high water (cached 1 s)."""
        now = time.monotonic()
        cached = self.backlog.get(source)
        if cached is None or now - cached[0] > BACKLOG_CACHE_S:
            cur = await conn.execute(
                Q["ingress_unrouted_count"], {"source_key": source, "cap": high_water}
            )
            count = int((await cur.fetchone() or {})["n"])
            self.backlog[source] = cached = (now, count)
        return cached[1] >= high_water
