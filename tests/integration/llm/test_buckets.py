"""Per-credential token buckets on PostgreSQL (SPEC §9), with a clock the test controls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.db import Conn
from eventos.errors import ConfigError
from eventos.llm.buckets import RateLimits, rate_limited, take

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LIMITS = RateLimits.from_doc({
    "key-a": {"c1": {"rpm": 60, "tpm": 10_000}, "*": {"rpm": 2, "tpm": 1_000}},
})  # fmt: skip


async def test_requests_and_tokens_per_minute_per_class(pool: AsyncConnectionPool[Conn]) -> None:
    async with pool.connection() as conn:
        c4 = names.C4_BACKGROUND
        assert await take(conn, LIMITS, "key-a", c4, 100, T0) == 0
        assert await take(conn, LIMITS, "key-a", c4, 100, T0) == 0
        assert await take(conn, LIMITS, "key-a", c4, 100, T0) == pytest.approx(30)  # 2 per min
        assert await take(conn, LIMITS, "key-a", c4, 100, T0 + timedelta(seconds=30)) == 0
        # The next request comes 30 s after the last refill started.
        wait = await take(conn, LIMITS, "key-a", c4, 100, T0 + timedelta(seconds=31))
        assert wait == pytest.approx(29, abs=0.1)
        # Tokens: C1 has 10,000 a minute; 9,000 taken, 5,000 more wait for 4,000 to refill.
        c1 = names.C1_OWNER
        assert await take(conn, LIMITS, "key-a", c1, 9000, T0) == 0
        assert await take(conn, LIMITS, "key-a", c1, 5000, T0) == pytest.approx(24)
        # C2 has its own bucket (from `*`); an unconfigured credential is not limited.
        assert await take(conn, LIMITS, "key-a", names.C2_CUSTOMER, 100, T0) == 0
        assert await take(conn, LIMITS, "other", c4, 10**9, T0) == 0


async def test_a_429_with_retry_after_pauses_every_class(pool: AsyncConnectionPool[Conn]) -> None:
    async with pool.connection() as conn:
        await rate_limited(conn, LIMITS, "key-a", names.C2_CUSTOMER, 20.0, T0)
        for klass in names.CLASSES:
            wait = await take(conn, LIMITS, "key-a", klass, 1, T0 + timedelta(seconds=5))
            assert wait == pytest.approx(15)
        assert await take(conn, LIMITS, "key-a", names.C1_OWNER, 1, T0 + timedelta(seconds=21)) == 0
        # A 429 without Retry-After drains only the class's bucket.
        await rate_limited(conn, LIMITS, "key-a", names.C1_OWNER, None, T0 + timedelta(seconds=21))
        assert await take(conn, LIMITS, "key-a", names.C1_OWNER, 1, T0 + timedelta(seconds=21)) > 0
        assert (
            await take(conn, LIMITS, "key-a", names.C3_INTERNAL, 1, T0 + timedelta(seconds=21)) == 0
        )


def test_rate_limits_are_checked() -> None:
    with pytest.raises(ConfigError, match="unknown classes"):
        RateLimits.from_doc({"k": {"c9": {"rpm": 1, "tpm": 1}}})
    with pytest.raises(ConfigError, match="positive numbers"):
        RateLimits.from_doc({"k": {"*": {"rpm": 0, "tpm": 1}}})
    with pytest.raises(ConfigError, match="not JSON"):
        RateLimits.from_env({"EVENTOS_LLM_RATE_LIMITS": "{"})
