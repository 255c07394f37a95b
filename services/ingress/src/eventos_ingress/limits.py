"""Per-source webhook limits (SPEC §15): rate buckets and the unrouted high water."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from eventos.errors import ConfigError


@dataclass(frozen=True)
class Limit:
    """Rate per second (burst twice that) and unrouted high water of one kind of source."""

    rate: float
    high_water: int

    @property
    def burst(self) -> float:
        return 2 * self.rate


@dataclass(frozen=True)
class HookLimits:
    """SPEC §15 defaults: signed webhooks 50/s and 10,000 unrouted; generic 10/s and 1,000."""

    signed: Limit = Limit(50.0, 10_000)
    generic: Limit = Limit(10.0, 1_000)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HookLimits:
        env = os.environ if env is None else env
        d = cls()
        try:
            return cls(
                Limit(float(env.get("EVENTOS_HOOKS_SIGNED_RATE", d.signed.rate)),
                      int(env.get("EVENTOS_HOOKS_SIGNED_HIGH_WATER", d.signed.high_water))),
                Limit(float(env.get("EVENTOS_HOOKS_GENERIC_RATE", d.generic.rate)),
                      int(env.get("EVENTOS_HOOKS_GENERIC_HIGH_WATER", d.generic.high_water))),
            )  # fmt: skip
        except ValueError as exc:
            raise ConfigError(f"webhook limits: {exc}") from None


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
    """Rate buckets per source key (one ingress replica's view)."""

    buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def retry_after(self, source: str, limit: Limit) -> int:
        """Seconds to wait (0 = go ahead)."""
        bucket = self.buckets.setdefault(source, TokenBucket(limit.rate, limit.burst))
        wait = bucket.take(time.monotonic())
        return 0 if wait == 0 else max(1, math.ceil(wait))
