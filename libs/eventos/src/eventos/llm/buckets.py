"""Provider rate limits (SPEC §9): per-credential token buckets, requests and tokens per
minute for each class, shared by every LLM worker through PostgreSQL.

`EVENTOS_LLM_RATE_LIMITS` (JSON) seeds them: `{"openai-main": {"c1": {"rpm": 60, "tpm":
100000}, "*": {"rpm": 200, "tpm": 400000}}}` (`*`: every class not named). A bucket starts full
(one minute's worth) and refills continuously. A 429 drains the class's bucket; a 429 with
Retry-After pauses the credential for every class until then (also for credentials without
configured limits). A step that must wait ends its attempt at once with a BENIGN retryable
error carrying `next_retry_delay`, so waiting never holds a worker slot.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from eventos import names
from eventos.contracts import ModelRef
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import ConfigError

WAIT_MAX_S = 300.0  # a longer wait is asked for again (SPEC §7: Retry-After capped at 5 min)


@dataclass(frozen=True)
class Rate:
    rpm: float
    tpm: float


@dataclass
class RateLimits:
    """The configured rates by credential and class."""

    rates: dict[str, dict[str, Rate]] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RateLimits:
        env = os.environ if env is None else env
        raw = env.get("EVENTOS_LLM_RATE_LIMITS", "").strip()
        if not raw:
            return cls()
        try:
            return cls.from_doc(json.loads(raw))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"EVENTOS_LLM_RATE_LIMITS is not JSON: {exc.msg}") from None

    @classmethod
    def from_doc(cls, doc: Any) -> RateLimits:
        where = "EVENTOS_LLM_RATE_LIMITS"
        if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
            raise ConfigError(f"{where} must map credentials to {{class: {{rpm, tpm}}}}")
        known = {f"c{k}" for k in names.CLASSES} | {"*"}
        rates: dict[str, dict[str, Rate]] = {}
        for credential, by_class in doc.items():
            unknown = sorted(set(by_class) - known)
            if unknown:
                raise ConfigError(f"{where}[{credential!r}]: unknown classes {unknown}")
            rates[credential] = {k: _rate(v, f"{where}[{credential!r}][{k!r}]")
                                 for k, v in by_class.items()}  # fmt: skip
        return cls(rates)

    def rate(self, credential: str, klass: int) -> Rate | None:
        by_class = self.rates.get(credential, {})
        return by_class.get(f"c{klass}") or by_class.get("*")


def _rate(value: Any, where: str) -> Rate:
    if not isinstance(value, dict) or set(value) != {"rpm", "tpm"}:
        raise ConfigError(f"{where} must be {{rpm, tpm}}")
    nums = [value["rpm"], value["tpm"]]
    if any(isinstance(n, bool) or not isinstance(n, int | float) or n <= 0 for n in nums):
        raise ConfigError(f"{where}: rpm and tpm are positive numbers")
    return Rate(float(nums[0]), float(nums[1]))


def credential_of(model: ModelRef) -> str:
    """The credential a step spends: its secret's name, else the endpoint it calls."""
    return model.credential or f"{model.provider}:{model.endpoint or model.base_url or 'default'}"


async def take(conn: Conn, limits: RateLimits, credential: str, klass: int, tokens: int,
               now: datetime) -> float:  # fmt: skip
    """One request and `tokens` from the class's bucket: 0 when taken, else seconds to wait."""
    async with conn.transaction():
        cur = await conn.execute(Q["credential_pause_get"], {"credential": credential, "now": now})
        paused = await cur.fetchone()
        if paused is not None:
            return float(min((paused["until"] - now).total_seconds(), WAIT_MAX_S))
        rate = limits.rate(credential, klass)
        if rate is None:
            return 0.0
        key = {"credential": credential, "class": klass, "now": now}
        cur = await conn.execute(Q["bucket_open"], {**key, "rpm": rate.rpm, "tpm": rate.tpm})
        row = await cur.fetchone() or {}
        elapsed = max((now - row["refilled_at"]).total_seconds(), 0.0)
        requests = min(rate.rpm, row["requests"] + rate.rpm * elapsed / 60)
        level = min(rate.tpm, row["tokens"] + rate.tpm * elapsed / 60)
        need = min(float(tokens), rate.tpm)  # a step larger than a minute's worth waits for full
        wait = max((1 - requests) * 60 / rate.rpm, (need - level) * 60 / rate.tpm, 0.0)
        if wait == 0.0:
            requests, level = requests - 1, level - need
        await conn.execute(Q["bucket_save"], {**key, "requests": requests, "tokens": level})
    return float(min(wait, WAIT_MAX_S))


async def rate_limited(conn: Conn, limits: RateLimits, credential: str, klass: int,
                       retry_after_s: float | None, now: datetime) -> None:  # fmt: skip
    """The provider answered 429: drain the class's bucket; with Retry-After, pause the
    credential for every class until then."""
    async with conn.transaction():
        if retry_after_s:
            until = now + timedelta(seconds=retry_after_s)
            await conn.execute(Q["credential_pause"], {
                "credential": credential, "until": until, "reason": "429 Retry-After",
            })  # fmt: skip
        rate = limits.rate(credential, klass)
        if rate is not None:
            key = {"credential": credential, "class": klass, "now": now}
            await conn.execute(Q["bucket_open"], {**key, "rpm": rate.rpm, "tpm": rate.tpm})
            await conn.execute(Q["bucket_save"], {**key, "requests": 0.0, "tokens": 0.0})
