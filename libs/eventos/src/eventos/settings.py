"""Settings, one object per concern, read from `EVENTOS_*` environment variables.

Bad values fail at boot; secrets never appear when a settings object is printed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eventos.errors import ConfigError, SecretUnavailable


def _get(env: Mapping[str, str], name: str, default: str | None = None) -> str:
    value = env.get(name, default)
    if value is None:
        raise ConfigError(f"{name} is required")
    return value


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """A positive integer setting; ConfigError naming the variable otherwise."""
    value = _int(env, name, default)
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {value}")
    return value


def _redact_url(url: str) -> str:
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


@dataclass(frozen=True)
class DatabaseSettings:
    """Where PostgreSQL is and how every connection is bounded."""

    url: str = field(repr=False)
    statement_timeout_ms: int = 5000
    idle_in_transaction_timeout_ms: int = 10000
    pool_min: int = 1
    pool_max: int = 10

    def __repr__(self) -> str:
        return (
            f"DatabaseSettings(url={_redact_url(self.url)!r}, "
            f"statement_timeout_ms={self.statement_timeout_ms}, pool_max={self.pool_max})"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DatabaseSettings:
        env = os.environ if env is None else env
        return cls(
            url=_get(env, "EVENTOS_DATABASE_URL"),
            statement_timeout_ms=_int(env, "EVENTOS_DB_STATEMENT_TIMEOUT_MS", 5000),
            idle_in_transaction_timeout_ms=_int(env, "EVENTOS_DB_IDLE_TX_TIMEOUT_MS", 10000),
            pool_min=_int(env, "EVENTOS_DB_POOL_MIN", 1),
            pool_max=_int(env, "EVENTOS_DB_POOL_MAX", 10),
        )


@dataclass(frozen=True)
class TemporalSettings:
    """Where the Temporal frontend is."""

    address: str = "127.0.0.1:7233"
    namespace: str = "default"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TemporalSettings:
        env = os.environ if env is None else env
        return cls(
            address=env.get("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
            namespace=env.get("TEMPORAL_NAMESPACE", "default"),
        )


@dataclass(frozen=True)
class ServiceSettings:
    """Where one service listens and whom it kicks after a commit."""

    name: str
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    kick_targets: tuple[str, ...] = ()
    poll_interval_s: float = 1.0

    @classmethod
    def from_env(cls, name: str, env: Mapping[str, str] | None = None) -> ServiceSettings:
        env = os.environ if env is None else env
        prefix = "EVENTOS_" + name.upper().replace("-", "_")
        targets = env.get(f"{prefix}_KICK", "")
        return cls(
            name=name,
            host=env.get("EVENTOS_BIND_HOST", "127.0.0.1"),
            http_port=_int(env, f"{prefix}_HTTP_PORT", 0),
            grpc_port=_int(env, f"{prefix}_GRPC_PORT", 0),
            kick_targets=tuple(t for t in targets.split(",") if t),
        )


@dataclass(frozen=True)
class SecretStore:
    """Resolves secret references: `EVENTOS_SECRET_<NAME>` or a file in the secrets directory."""

    env: Mapping[str, str] = field(repr=False)
    directory: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SecretStore:
        env = os.environ if env is None else env
        directory = env.get("EVENTOS_SECRETS_DIR")
        return cls(env=dict(env), directory=Path(directory) if directory else None)

    def resolve(self, ref: str) -> bytes:
        """The secret named `ref`, or SecretUnavailable."""
        var = "EVENTOS_SECRET_" + ref.upper().replace("-", "_").replace(".", "_")
        if var in self.env:
            return self.env[var].encode()
        if self.directory is not None:
            path = self.directory / ref
            if path.is_file():
                return path.read_bytes().rstrip(b"\r\n")
        raise SecretUnavailable(f"secret {ref!r} is not available")


@dataclass(frozen=True)
class AdminSettings:
    """The owner API's bearer token."""

    token: str = field(repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AdminSettings:
        env = os.environ if env is None else env
        token = _get(env, "EVENTOS_ADMIN_TOKEN")
        if len(token) < 16:
            raise ConfigError("EVENTOS_ADMIN_TOKEN must be at least 16 characters")
        return cls(token=token)


def llm_classes(env: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """The classes an LLM worker polls: `LLM_CLASS` (`2`, `c2`, `llm-c2`, comma list), else all."""
    env = os.environ if env is None else env
    raw = env.get("LLM_CLASS", "").strip()
    if not raw:
        return (1, 2, 3, 4)
    classes: list[int] = []
    for part in raw.split(","):
        token = part.strip().lower().removeprefix("llm-").removeprefix("c")
        if token not in ("1", "2", "3", "4"):
            raise ConfigError(f"LLM_CLASS must name classes 1 to 4 (e.g. c2), got {part!r}")
        classes.append(int(token))
    return tuple(sorted(set(classes)))
