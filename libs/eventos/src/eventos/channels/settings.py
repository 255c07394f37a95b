"""Settings of the channel readers (ingress) and senders (egress), `EVENTOS_CHANNELS_*`.

Bad values fail at boot, naming the variable. `EVENTOS_CHANNELS_BUCKETS` (JSON) overrides the
send buckets per driver: `{"telegram": {"account": {"rate": 30, "burst": 30},
"recipient": {"rate": 1, "burst": 3}}}` (tokens per second, bucket size).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eventos.errors import ConfigError
from eventos.settings import env_int

TELEGRAM_API_VAR = "EVENTOS_CHANNELS_TELEGRAM_API"
BUCKETS_VAR = "EVENTOS_CHANNELS_BUCKETS"
TELEGRAM_API = "https://api.telegram.org"


@dataclass(frozen=True)
class Bucket:
    """Tokens per second and the bucket's size."""

    rate: float
    burst: float


# Provider limits as documented: Telegram about 30 messages/s per bot and 1/s per chat (short
# bursts allowed); WhatsApp Cloud 80/s per number and a pair rate of about 1 per 6 s; Discord
# 50/s global and 5 per 5 s per channel; email by the relay's policy.
DEFAULT_BUCKETS: dict[str, dict[str, Bucket]] = {
    "telegram": {"account": Bucket(30.0, 30.0), "recipient": Bucket(1.0, 3.0)},
    "whatsapp_business": {"account": Bucket(80.0, 80.0), "recipient": Bucket(1 / 6, 3.0)},
    "discord": {"account": Bucket(50.0, 50.0), "recipient": Bucket(1.0, 5.0)},
    "email": {"account": Bucket(5.0, 20.0), "recipient": Bucket(0.2, 5.0)},
}


@dataclass(frozen=True)
class ChannelSettings:
    """Where the providers are, how readers poll and lease, and the send buckets."""

    telegram_api: str = TELEGRAM_API
    poll_timeout_s: int = 25  # Telegram's long poll (its server holds a call up to 50 s)
    gateway_wait_s: int = 5  # Discord: a gateway read returns a page after at most this
    lease_ttl_s: int = 30
    refresh_s: int = 5
    down_alert_s: int = 300  # SPEC §6.4: an account down for over 5 minutes raises an item
    send_timeout_s: int = 10  # under the send activity's 30 s start-to-close
    high_water: int = 500  # queued sends per account above which producing turns wait
    email_poll_s: int = 15  # an IMAP account with no new mail is asked again after this
    backlog_max: int = 5000  # SPEC §15: unconsumed inputs per account before reads pause
    buckets: dict[str, dict[str, Bucket]] = field(default_factory=lambda: dict(DEFAULT_BUCKETS))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ChannelSettings:
        env = os.environ if env is None else env
        api = env.get(TELEGRAM_API_VAR, "").strip() or TELEGRAM_API
        if not api.startswith(("https://", "http://")):
            raise ConfigError(f"{TELEGRAM_API_VAR} must be an http(s) URL, got {api!r}")
        return cls(
            telegram_api=api.rstrip("/"),
            poll_timeout_s=env_int(env, "EVENTOS_CHANNELS_POLL_TIMEOUT_S", 25),
            gateway_wait_s=env_int(env, "EVENTOS_CHANNELS_GATEWAY_WAIT_S", 5),
            lease_ttl_s=env_int(env, "EVENTOS_CHANNELS_LEASE_TTL_S", 30),
            refresh_s=env_int(env, "EVENTOS_CHANNELS_REFRESH_S", 5),
            down_alert_s=env_int(env, "EVENTOS_CHANNELS_DOWN_ALERT_S", 300),
            send_timeout_s=env_int(env, "EVENTOS_CHANNELS_SEND_TIMEOUT_S", 10),
            high_water=env_int(env, "EVENTOS_CHANNELS_HIGH_WATER", 500),
            email_poll_s=env_int(env, "EVENTOS_CHANNELS_EMAIL_POLL_S", 15),
            backlog_max=env_int(env, "EVENTOS_CHANNELS_BACKLOG_MAX", 5000),
            buckets=parse_buckets(env.get(BUCKETS_VAR, "")),
        )

    def bucket(self, driver: str, scope: str) -> Bucket:
        """The `account` or `recipient` bucket of a driver."""
        return self.buckets.get(driver, DEFAULT_BUCKETS["email"])[scope]


def parse_buckets(raw: str) -> dict[str, dict[str, Bucket]]:
    """The default buckets with the overrides of `EVENTOS_CHANNELS_BUCKETS` applied."""
    merged = {d: dict(b) for d, b in DEFAULT_BUCKETS.items()}
    if not raw.strip():
        return merged
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{BUCKETS_VAR} is not JSON: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{BUCKETS_VAR} must map drivers to {{account, recipient}}")
    for driver, scopes in doc.items():
        if driver not in DEFAULT_BUCKETS or not isinstance(scopes, dict):
            raise ConfigError(f"{BUCKETS_VAR}: unknown driver {driver!r}")
        for scope, value in scopes.items():
            if scope not in ("account", "recipient"):
                raise ConfigError(f"{BUCKETS_VAR}[{driver!r}]: unknown scope {scope!r}")
            merged[driver][scope] = _bucket(value, f"{BUCKETS_VAR}[{driver!r}][{scope!r}]")
    return merged


def _bucket(value: Any, where: str) -> Bucket:
    if not isinstance(value, dict) or set(value) != {"rate", "burst"}:
        raise ConfigError(f"{where} must be {{rate, burst}}")
    nums = [value["rate"], value["burst"]]
    if any(isinstance(n, bool) or not isinstance(n, int | float) or n <= 0 for n in nums):
        raise ConfigError(f"{where}: rate and burst are positive numbers")
    if nums[1] < 1:
        raise ConfigError(f"{where}: burst must hold at least one token")
    return Bucket(float(nums[0]), float(nums[1]))
