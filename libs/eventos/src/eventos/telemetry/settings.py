"""Settings of the telemetry a service exports (the standard `OTEL_*` variables the chart sets)
and of its logs (`EVENTOS_LOG_*`). Bad values fail at boot, naming the variable."""

from __future__ import annotations

import logging
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from eventos.errors import ConfigError
from eventos.telemetry.allowlist import RESOURCE_KEYS

ENDPOINT_VAR = "OTEL_EXPORTER_OTLP_ENDPOINT"
PROTOCOL_VAR = "OTEL_EXPORTER_OTLP_PROTOCOL"
HEADERS_VAR = "OTEL_EXPORTER_OTLP_HEADERS"
TIMEOUT_VAR = "OTEL_EXPORTER_OTLP_TIMEOUT"
INTERVAL_VAR = "OTEL_METRIC_EXPORT_INTERVAL"
RESOURCE_VAR = "OTEL_RESOURCE_ATTRIBUTES"
SERVICE_NAME_VAR = "OTEL_SERVICE_NAME"
DISABLED_VAR = "OTEL_SDK_DISABLED"
INSTANCE_VAR = "EVENTOS_INSTANCE_ID"
TIER_VAR = "EVENTOS_TIER"
RELEASE_VAR = "EVENTOS_RELEASE"
LOG_FORMAT_VAR = "EVENTOS_LOG_FORMAT"
LOG_LEVEL_VAR = "EVENTOS_LOG_LEVEL"
LOG_EXCEPTIONS_VAR = "EVENTOS_LOG_EXCEPTIONS"

PROTOCOLS = ("grpc", "http/protobuf")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# How a logged exception is shown at INFO and above: its type and frames (a shared or fleet
# instance), or its text too, redacted (the operator's own instance: `make run`).
LOG_EXCEPTION_TYPE, LOG_EXCEPTION_TEXT = "type", "text"
LOG_EXCEPTIONS = (LOG_EXCEPTION_TYPE, LOG_EXCEPTION_TEXT)
# The resource values, each of a shape that cannot carry a name or a sentence.
INSTANCE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
TIERS = ("S", "L")

log = logging.getLogger(__name__)


def _ms(env: Mapping[str, str], name: str, default: int, high: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 0 < int(raw) <= high:
        raise ConfigError(f"{name} must be milliseconds in 1..{high}, got {raw!r}")
    return int(raw)


def _pairs(env: Mapping[str, str], name: str) -> dict[str, str]:
    """`k=v,k=v` with percent-encoded values (the OTel convention)."""
    found: dict[str, str] = {}
    for part in env.get(name, "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{name} must be key=value pairs separated by commas")
        found[key.strip()] = urllib.parse.unquote(value.strip())
    return found


def _resource(env: Mapping[str, str], service_name: str) -> dict[str, str]:
    """The allowlisted resource attributes; any other key is dropped (its name logged)."""
    given = _pairs(env, RESOURCE_VAR)
    dropped = sorted(set(given) - set(RESOURCE_KEYS))
    if dropped:
        log.warning("%s: not exported (not on the allowlist): %s", RESOURCE_VAR, ", ".join(dropped))
    attrs = {k: v for k, v in given.items() if k in RESOURCE_KEYS}
    fallbacks = {"eventos.instance.id": INSTANCE_VAR, "eventos.tier": TIER_VAR,
                 "service.version": RELEASE_VAR}  # fmt: skip
    for key, var in fallbacks.items():
        if key not in attrs and env.get(var):
            attrs[key] = env[var]
    attrs.setdefault("service.namespace", "eventos")
    attrs["service.name"] = service_name
    _check_resource(attrs)
    return attrs


def _check_resource(attrs: Mapping[str, str]) -> None:
    instance, tier = attrs.get("eventos.instance.id"), attrs.get("eventos.tier")
    if instance is not None and not INSTANCE_ID.fullmatch(instance):
        raise ConfigError(
            f"{RESOURCE_VAR}/{INSTANCE_VAR}: the instance id must be an opaque id of lower-case "
            "letters, digits and '-' (never an owner's name)"
        )
    if tier is not None and tier not in TIERS:
        raise ConfigError(f"{RESOURCE_VAR}/{TIER_VAR}: the tier must be S or L, got {tier!r}")
    for key in ("service.name", "service.namespace", "service.version"):
        if key in attrs and not TOKEN.fullmatch(attrs[key]):
            raise ConfigError(f"{RESOURCE_VAR}: {key} must be a short token, got {attrs[key]!r}")


@dataclass(frozen=True)
class TelemetrySettings:
    """Where and how a service exports OTLP: metrics and error reports (SPEC §13). No
    endpoint, or `OTEL_SDK_DISABLED=true`: nothing is exported."""

    service_name: str
    endpoint: str = ""
    protocol: str = "grpc"
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # may carry a token
    timeout_ms: int = 10_000
    interval_ms: int = 60_000
    resource: dict[str, str] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)

    @classmethod
    def from_env(cls, service: str, env: Mapping[str, str] | None = None) -> TelemetrySettings:
        env = os.environ if env is None else env
        name = env.get(SERVICE_NAME_VAR, "").strip() or f"eventos-{service}"
        disabled = env.get(DISABLED_VAR, "").strip().lower() == "true"
        endpoint = "" if disabled else env.get(ENDPOINT_VAR, "").strip()
        if endpoint and urllib.parse.urlsplit(endpoint).scheme not in ("http", "https"):
            raise ConfigError(f"{ENDPOINT_VAR} must be an http:// or https:// URL")
        protocol = env.get(PROTOCOL_VAR, "").strip() or "grpc"
        if protocol not in PROTOCOLS:
            raise ConfigError(f"{PROTOCOL_VAR} must be one of {', '.join(PROTOCOLS)}")
        return cls(
            service_name=name,
            endpoint=endpoint,
            protocol=protocol,
            headers=_pairs(env, HEADERS_VAR),
            timeout_ms=_ms(env, TIMEOUT_VAR, cls.timeout_ms, 120_000),
            interval_ms=_ms(env, INTERVAL_VAR, cls.interval_ms, 3_600_000),
            resource=_resource(env, name),
        )


@dataclass(frozen=True)
class LogSettings:
    """`EVENTOS_LOG_FORMAT` (text or json), `EVENTOS_LOG_LEVEL` (default INFO) and
    `EVENTOS_LOG_EXCEPTIONS` (`type`, the default: an exception's type and frames; `text`: its
    redacted text too, for the operator's own instance)."""

    format: str = "text"
    level: str = "INFO"
    exceptions: str = LOG_EXCEPTION_TYPE

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LogSettings:
        env = os.environ if env is None else env
        fmt = env.get(LOG_FORMAT_VAR, "").strip().lower() or cls.format
        if fmt not in LOG_FORMATS:
            raise ConfigError(f"{LOG_FORMAT_VAR} must be one of {', '.join(LOG_FORMATS)}")
        level = env.get(LOG_LEVEL_VAR, "").strip().upper() or cls.level
        if level not in LOG_LEVELS:
            raise ConfigError(f"{LOG_LEVEL_VAR} must be one of {', '.join(LOG_LEVELS)}")
        shown = env.get(LOG_EXCEPTIONS_VAR, "").strip().lower() or cls.exceptions
        if shown not in LOG_EXCEPTIONS:
            raise ConfigError(f"{LOG_EXCEPTIONS_VAR} must be one of {', '.join(LOG_EXCEPTIONS)}")
        return cls(fmt, level, shown)
