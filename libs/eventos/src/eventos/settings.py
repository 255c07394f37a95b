"""Settings, one object per concern, read from `EVENTOS_*` environment variables.

Bad values fail at boot; secrets never appear when a settings object is printed.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from eventos import names
from eventos.errors import ConfigError, SecretUnavailable
from eventos.secret_files import (
    DEFAULT_OVERLAP_S,
    DEFAULT_RECHECK_S,
    RotatingFile,
    SecretFiles,
    SecretVersions,
)
from eventos.secret_purposes import SecretPurposes

log = logging.getLogger(__name__)


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


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A true/false setting (1/0, true/false, yes/no, on/off); ConfigError otherwise."""
    return _bool(env, name, default)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _bounded(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low:g} and {high:g}, got {value:g}")


def _file(env: Mapping[str, str], name: str) -> bytes | None:
    path = env.get(name, "")
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path!r} ({exc.strerror})") from None


def is_loopback(host: str) -> bool:
    """Whether a bind host only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _redact_url(url: str) -> str:
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


@dataclass(frozen=True)
class DatabaseSettings:
    """Where PostgreSQL is and how every connection is bounded: each statement has a deadline
    (`statement_timeout`), an idle transaction too, a connection attempt and a pool checkout
    wait at most their timeouts, and TCP keepalives notice a peer that vanished without
    closing (a crashed host, a dropped NAT entry) within idle + interval * count seconds
    (60 s by default) instead of the kernel's two hours."""

    url: str = field(repr=False)
    statement_timeout_ms: int = 5000
    idle_in_transaction_timeout_ms: int = 10000
    pool_min: int = 1
    pool_max: int = 10
    pool_timeout_s: float = 5.0  # a checkout waits at most this (then DatabaseUnavailable)
    connect_timeout_s: int = 5
    keepalives_idle_s: int = 30  # silence before the first probe
    keepalives_interval_s: int = 10  # between probes
    keepalives_count: int = 3  # unanswered probes before the connection is dropped

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
            pool_timeout_s=_float(env, "EVENTOS_DB_POOL_TIMEOUT_S", cls.pool_timeout_s),
            connect_timeout_s=env_int(env, "EVENTOS_DB_CONNECT_TIMEOUT_S", cls.connect_timeout_s),
            keepalives_idle_s=env_int(env, "EVENTOS_DB_KEEPALIVES_IDLE_S", cls.keepalives_idle_s),
            keepalives_interval_s=env_int(
                env, "EVENTOS_DB_KEEPALIVES_INTERVAL_S", cls.keepalives_interval_s
            ),
            keepalives_count=env_int(env, "EVENTOS_DB_KEEPALIVES_COUNT", cls.keepalives_count),
        )

    def __post_init__(self) -> None:
        _bounded("EVENTOS_DB_POOL_TIMEOUT_S", self.pool_timeout_s, 0.1, 600)
        _bounded("EVENTOS_DB_STATEMENT_TIMEOUT_MS", self.statement_timeout_ms, 1, 3_600_000)


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


# Workflow tasks one process runs at once (EVENTOS_WORKFLOW_TASK_SLOTS). A task first replays
# its workflow's history unless the process has it cached (about 0.5 ms an event on one core;
# an entity runs to 4,000 events before continue-as-new): a restarted worker that took every
# waiting task at once ran them side by side under the GIL, each past its 10 s timeout, and
# each retry replayed again, so no turn started for minutes (the fault run). Tasks beyond the
# slots wait in Temporal's queue, where no timeout runs.
WORKFLOW_TASK_SLOTS = 4
# Of the owner's workflow queue (EVENTOS_OWNER_WORKFLOW_TASK_SLOTS), on top of those: an owner's
# conversation or turn never waits for a slot held by background work.
OWNER_WORKFLOW_TASK_SLOTS = 2
# Of the turns' workflow queue (EVENTOS_TURN_WORKFLOW_TASK_SLOTS), on top of those: an admitted
# turn never waits for a slot held by the conversations' tasks (a burst starts hundreds).
TURN_WORKFLOW_TASK_SLOTS = 2


@dataclass(frozen=True)
class WorkflowSettings:
    """How a workers-workflow process runs its workflow tasks."""

    task_slots: int = WORKFLOW_TASK_SLOTS
    owner_task_slots: int = OWNER_WORKFLOW_TASK_SLOTS
    turn_task_slots: int = TURN_WORKFLOW_TASK_SLOTS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkflowSettings:
        """`EVENTOS_WORKFLOW_TASK_SLOTS`, `EVENTOS_OWNER_WORKFLOW_TASK_SLOTS` and
        `EVENTOS_TURN_WORKFLOW_TASK_SLOTS` (positive integers), else WORKFLOW_TASK_SLOTS,
        OWNER_WORKFLOW_TASK_SLOTS and TURN_WORKFLOW_TASK_SLOTS."""
        env = os.environ if env is None else env
        return cls(
            positive_int(env, "EVENTOS_WORKFLOW_TASK_SLOTS", WORKFLOW_TASK_SLOTS),
            positive_int(env, "EVENTOS_OWNER_WORKFLOW_TASK_SLOTS", OWNER_WORKFLOW_TASK_SLOTS),
            positive_int(env, "EVENTOS_TURN_WORKFLOW_TASK_SLOTS", TURN_WORKFLOW_TASK_SLOTS),
        )


@dataclass(frozen=True)
class TurnTimeouts:
    """How long Temporal gives a turn's attempts before it retries them elsewhere (a worker
    killed mid-attempt is noticed only then). The relay puts them in each conversation's
    cursor (continue-as-new carries them) and each turn takes them from its input, so they
    hold for conversations started after a change. Positive seconds:

    - `send_s` (`EVENTOS_TURN_SEND_TIMEOUT_S`, 30): a channel send's attempt, and so its
      claim's life: a later attempt takes an unsettled claim over only this long after it was
      made. Keep it above the senders' own timeout (`EVENTOS_CHANNELS_SEND_TIMEOUT_S`, 10).
    - `llm_heartbeat_s` (`EVENTOS_TURN_LLM_HEARTBEAT_S`, 60): a model step's attempt not heard
      from this long is retried (the worker beats at half of it at least)."""

    send_s: float = float(names.SEND_CLAIM_TTL_S)
    llm_heartbeat_s: float = names.LLM_HEARTBEAT_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TurnTimeouts:
        env = os.environ if env is None else env
        values = []
        for var, default in (("EVENTOS_TURN_SEND_TIMEOUT_S", cls.send_s),
                             ("EVENTOS_TURN_LLM_HEARTBEAT_S", cls.llm_heartbeat_s)):  # fmt: skip
            value = _float(env, var, default)
            if value <= 0:
                raise ConfigError(f"{var} must be a positive number of seconds, got {value:g}")
            values.append(value)
        return cls(*values)


def positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    """A settings class's positive integer `name` of `env`, else `default` (ConfigError)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}")
    return int(raw)


TOOLS_BIN_VAR = "EVENTOS_TOOLS_BIN"
CHART_VAR = "EVENTOS_CHART"
TEMPORAL_SERVER_VERSION_VAR = "EVENTOS_TEMPORAL_SERVER_VERSION"
# Where `make` builds each Temporal server version, beside the tools' bin folder (Makefile).
TEMPORAL_BUILDS = "temporal-server"


@dataclass(frozen=True)
class ServerTools:
    """Where tier L's Temporal server, its schema tool and helm are (`make tools` puts them in a
    checkout's `.tools/bin`), and the instance chart whose server config they run.

    The Temporal server runs from one build folder, `.tools/temporal-server/v<version>` (its
    `bin/` and the `schema/` its tool applies): `temporal_dir` when given (an upgrade's request
    names it), else the version EVENTOS_TEMPORAL_SERVER_VERSION names beside `bin_dir` (`make`
    builds the pinned one and the previous minor), else the one `bin_dir` links to (the pin)."""

    bin_dir: Path
    chart: Path
    temporal_version: str = ""
    temporal_dir: Path | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, root: Path | None = None
    ) -> ServerTools:
        """EVENTOS_TOOLS_BIN, EVENTOS_CHART and EVENTOS_TEMPORAL_SERVER_VERSION, else those of
        the checkout at `root` (the working directory unless given)."""
        env = os.environ if env is None else env
        base = root or Path.cwd()
        return cls(
            bin_dir=Path(env.get(TOOLS_BIN_VAR) or base / ".tools" / "bin"),
            chart=Path(env.get(CHART_VAR) or base / "deploy" / "helm" / "eventos"),
            temporal_version=env.get(TEMPORAL_SERVER_VERSION_VAR, "").strip(),
        )

    def binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"{path} is missing: run `make tools` to build it ({TOOLS_BIN_VAR})")
        return path

    def temporal_build(self) -> Path:
        """The folder of the Temporal server build to run (see the class)."""
        if self.temporal_dir is not None:
            return self.temporal_dir
        if self.temporal_version:
            return self.bin_dir.parent / TEMPORAL_BUILDS / f"v{self.temporal_version}"
        return self.binary("temporal-server").resolve().parent.parent

    def temporal_binary(self, name: str) -> Path:
        """`temporal-server` or `temporal-sql-tool` of the build to run."""
        path = self.temporal_build() / "bin" / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(
                f"{path} is missing: `make tools` builds the pinned Temporal server, `make test` "
                f"the previous minor too ({TEMPORAL_SERVER_VERSION_VAR})"
            )
        return path


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
    """Resolves secret references: `EVENTOS_SECRET_<NAME>` or a file in the secrets directory,
    each only for the purpose the operator declared for it (EVENTOS_SECRETS_PURPOSES).

    A file is re-read when it changes (at most every `EVENTOS_SECRETS_RECHECK_S`, on use) and
    its previous value stays valid for checks for `EVENTOS_SECRETS_OVERLAP_S` (docs/security.md,
    "Rotating secrets"); a variable is fixed for the process's life."""

    env: Mapping[str, str] = field(repr=False)
    directory: Path | None = None
    purposes: SecretPurposes = field(init=False, repr=False, compare=False)
    files: SecretFiles = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "purposes", SecretPurposes.from_env(self.env))
        overlap, recheck = rotation_windows(self.env)
        object.__setattr__(self, "files", SecretFiles(self.directory, overlap, recheck))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SecretStore:
        env = os.environ if env is None else env
        directory = env.get("EVENTOS_SECRETS_DIR")
        return cls(env=dict(env), directory=Path(directory) if directory else None)

    def resolve(self, ref: str, purpose: str) -> bytes:
        """The secret named `ref` for `purpose`, or SecretUnavailable (SecretOutsidePurpose
        when the operator declared it for another use: it is not read at all)."""
        return self.versions(ref, purpose).current

    def versions(self, ref: str, purpose: str) -> SecretVersions:
        """The secret's current value and, within the overlap window after its file changed,
        the previous one: what an inbound check (a webhook's signature) accepts."""
        self.purposes.check(ref, purpose)
        var = "EVENTOS_SECRET_" + ref.upper().replace("-", "_").replace(".", "_")
        if var in self.env:
            return SecretVersions(self.env[var].encode())
        found = self.files.read(ref)
        if found is None:
            raise SecretUnavailable(f"secret {ref!r} is not available")
        return found


def rotation_windows(env: Mapping[str, str]) -> tuple[float, float]:
    """(overlap, recheck) seconds of rotating secret files: `EVENTOS_SECRETS_OVERLAP_S`
    (default 24 h, 0 ends the previous value at once) and `EVENTOS_SECRETS_RECHECK_S`."""
    overlap = _float(env, "EVENTOS_SECRETS_OVERLAP_S", DEFAULT_OVERLAP_S)
    recheck = _float(env, "EVENTOS_SECRETS_RECHECK_S", DEFAULT_RECHECK_S)
    _bounded("EVENTOS_SECRETS_OVERLAP_S", overlap, 0, 30 * 86400)
    _bounded("EVENTOS_SECRETS_RECHECK_S", recheck, 0, 300)
    return overlap, recheck


@dataclass(frozen=True)
class AdminSettings:
    """The owner API's bearer token: `EVENTOS_ADMIN_TOKEN`, or the file named by
    `EVENTOS_ADMIN_TOKEN_FILE`, re-read when it changes (the previous token is accepted for the
    overlap window, so clients can switch)."""

    token: str = field(repr=False)
    token_file: RotatingFile | None = field(default=None, repr=False, compare=False)
    # The last good token read from the file, and the last complaint logged about it.
    _state: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AdminSettings:
        env = os.environ if env is None else env
        path = env.get("EVENTOS_ADMIN_TOKEN_FILE", "")
        if not path:
            return cls(token=_admin_token(_get(env, "EVENTOS_ADMIN_TOKEN")))
        overlap, recheck = rotation_windows(env)
        rotating = RotatingFile(Path(path), SecretFiles(None, overlap, recheck), "admin token")
        try:
            token = rotating.versions().current.decode()
        except (SecretUnavailable, UnicodeDecodeError):
            raise ConfigError(
                f"EVENTOS_ADMIN_TOKEN_FILE: cannot read a token from {path!r}"
            ) from None
        return cls(token=_admin_token(token), token_file=rotating)

    def tokens(self) -> tuple[bytes, ...]:
        """The tokens accepted now: the file's current one (and the previous one within the
        window), or the variable's. A file that became unreadable, empty or too short keeps the
        last good token in use (said once, never its value)."""
        if self.token_file is None:
            return (self.token.encode(),)
        try:
            found = self.token_file.versions()
            if len(found.current) < ADMIN_TOKEN_MIN:
                raise SecretUnavailable(f"the admin token file holds under {ADMIN_TOKEN_MIN} bytes")
        except SecretUnavailable as exc:
            if self._state.get("complaint") != str(exc):
                self._state["complaint"] = str(exc)
                log.warning("%s; the last good admin token stays in use", exc)
            return (self._state.get("good", self.token.encode()),)
        self._state["good"] = found.current
        self._state.pop("complaint", None)
        # A previous value that was never a valid token (a bad write in between) is not one now.
        return tuple(token for token in found.all() if len(token) >= ADMIN_TOKEN_MIN)


ADMIN_TOKEN_MIN = 16


def _admin_token(token: str) -> str:
    if len(token) < ADMIN_TOKEN_MIN:
        raise ConfigError(f"EVENTOS_ADMIN_TOKEN must be at least {ADMIN_TOKEN_MIN} characters")
    return token


KIB = 1024
MIB = 1024 * 1024
GRPC_TLS_VARS = "EVENTOS_INGRESS_GRPC_TLS_CERT_FILE/EVENTOS_INGRESS_GRPC_TLS_KEY_FILE"


@dataclass(frozen=True)
class GrpcIngressSettings:
    """The gRPC EventIngress edge (SPEC §6.3): credentials, transport and every bound.

    Defaults let real traffic through untouched (a 1,000-event Publish burst is acknowledged
    in order, paced by acks past 4 MiB read ahead) while one stream cannot hold more than
    4 MiB of the process's memory.
    """

    internal_token: str | None = field(default=None, repr=False)
    tls_cert: bytes | None = field(default=None, repr=False)
    tls_key: bytes | None = field(default=None, repr=False)
    insecure: bool = False
    # A 64 KB envelope plus the other fields and protobuf framing.
    max_message_bytes: int = 64 * KIB + 16 * KIB
    read_ahead_events: int = 1000
    read_ahead_bytes: int = 4 * MIB
    max_streams: int = 64
    # A driver runs one stream at a time (eventos.bus.driver); a few more cover a restart whose
    # old connection keepalive has not yet dropped. No driver can take every stream.
    max_streams_per_driver: int = 4
    max_concurrent_rpcs: int = 256
    keepalive_time_s: float = 30.0
    keepalive_timeout_s: float = 20.0
    max_connection_idle_s: float = 300.0
    # Drivers rotate their stream before a 600 s deadline; past this age plus the grace a
    # connection is closed whatever runs on it (its unacknowledged events are resent).
    max_connection_age_s: float = 1800.0
    max_connection_age_grace_s: float = 120.0

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GrpcIngressSettings:
        env = os.environ if env is None else env
        token = env.get("EVENTOS_INTERNAL_TOKEN") or None
        if token is not None and len(token) < 16:
            raise ConfigError("EVENTOS_INTERNAL_TOKEN must be at least 16 characters")
        cert = _file(env, "EVENTOS_INGRESS_GRPC_TLS_CERT_FILE")
        key = _file(env, "EVENTOS_INGRESS_GRPC_TLS_KEY_FILE")
        if (cert is None) != (key is None):
            raise ConfigError(f"{GRPC_TLS_VARS}: set both or neither")
        p = "EVENTOS_INGRESS_"
        settings = cls(
            internal_token=token,
            tls_cert=cert,
            tls_key=key,
            insecure=_bool(env, p + "GRPC_INSECURE", False),
            max_message_bytes=_int(env, p + "GRPC_MAX_MESSAGE_BYTES", cls.max_message_bytes),
            read_ahead_events=_int(env, p + "PUBLISH_READ_AHEAD_EVENTS", cls.read_ahead_events),
            read_ahead_bytes=_int(env, p + "PUBLISH_READ_AHEAD_BYTES", cls.read_ahead_bytes),
            max_streams=_int(env, p + "PUBLISH_MAX_STREAMS", cls.max_streams),
            max_streams_per_driver=_int(
                env, p + "PUBLISH_MAX_STREAMS_PER_DRIVER", cls.max_streams_per_driver
            ),
            max_concurrent_rpcs=_int(env, p + "GRPC_MAX_CONCURRENT_RPCS", cls.max_concurrent_rpcs),
            keepalive_time_s=_float(env, p + "GRPC_KEEPALIVE_TIME_S", cls.keepalive_time_s),
            keepalive_timeout_s=_float(
                env, p + "GRPC_KEEPALIVE_TIMEOUT_S", cls.keepalive_timeout_s
            ),
            max_connection_idle_s=_float(
                env, p + "GRPC_MAX_CONNECTION_IDLE_S", cls.max_connection_idle_s
            ),
            max_connection_age_s=_float(
                env, p + "GRPC_MAX_CONNECTION_AGE_S", cls.max_connection_age_s
            ),
            max_connection_age_grace_s=_float(
                env, p + "GRPC_MAX_CONNECTION_AGE_GRACE_S", cls.max_connection_age_grace_s
            ),
        )
        settings.check_bounds()
        return settings

    def check_bounds(self) -> None:
        """ConfigError naming the variable of a bound out of its range."""
        p = "EVENTOS_INGRESS_"
        _bounded(p + "GRPC_MAX_MESSAGE_BYTES", self.max_message_bytes, 4 * KIB, 64 * MIB)
        # SPEC §6.3: at most 1,000 events in flight per stream.
        _bounded(p + "PUBLISH_READ_AHEAD_EVENTS", self.read_ahead_events, 1, 1000)
        _bounded(p + "PUBLISH_READ_AHEAD_BYTES", self.read_ahead_bytes, 64 * KIB, 1024 * MIB)
        _bounded(p + "PUBLISH_MAX_STREAMS", self.max_streams, 1, 100_000)
        _bounded(p + "PUBLISH_MAX_STREAMS_PER_DRIVER", self.max_streams_per_driver, 1, 100_000)
        _bounded(p + "GRPC_MAX_CONCURRENT_RPCS", self.max_concurrent_rpcs, 1, 100_000)
        _bounded(p + "GRPC_KEEPALIVE_TIME_S", self.keepalive_time_s, 1, 86_400)
        _bounded(p + "GRPC_KEEPALIVE_TIMEOUT_S", self.keepalive_timeout_s, 1, 3600)
        _bounded(p + "GRPC_MAX_CONNECTION_IDLE_S", self.max_connection_idle_s, 0.1, 86_400)
        _bounded(p + "GRPC_MAX_CONNECTION_AGE_S", self.max_connection_age_s, 0.1, 30 * 86_400)
        grace = self.max_connection_age_grace_s
        _bounded(p + "GRPC_MAX_CONNECTION_AGE_GRACE_S", grace, 0, 86_400)

    def check_transport(self, host: str) -> None:
        """Refuse plaintext gRPC off loopback unless the operator said so."""
        if self.tls or self.insecure or is_loopback(host):
            return
        raise ConfigError(
            f"the gRPC ingress would serve plaintext on {host!r} (EVENTOS_BIND_HOST): set "
            f"{GRPC_TLS_VARS}, or EVENTOS_INGRESS_GRPC_INSECURE=true when a mesh or a "
            "private network protects the port"
        )

    def server_options(self) -> tuple[tuple[str, int], ...]:
        """grpc server channel arguments: message size, keepalive, idle connections."""
        ms = 1000
        return (
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", int(self.keepalive_time_s * ms)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_s * ms)),
            # Newer gRPC cores time a sent ping out by this one (default 60 s).
            ("grpc.http2.ping_timeout_ms", int(self.keepalive_timeout_s * ms)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_sent_ping_interval_without_data_ms", int(self.keepalive_time_s * ms)),
            # Drivers ping every 30 s or more (eventos.bus.driver); faster pings are refused.
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10 * ms),
            ("grpc.max_connection_idle_ms", int(self.max_connection_idle_s * ms)),
            ("grpc.max_connection_age_ms", int(self.max_connection_age_s * ms)),
            ("grpc.max_connection_age_grace_ms", int(self.max_connection_age_grace_s * ms)),
        )


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


@dataclass(frozen=True)
class HttpToolSettings:
    """Bounds of the `http_request` tool: each call's time, the response bytes read (the rest
    is cut), and the body the model reads back."""

    timeout_s: float = 20.0
    max_response_bytes: int = 1024 * 1024
    max_body_shown: int = 8 * 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HttpToolSettings:
        env = os.environ if env is None else env
        timeout = _float(env, "EVENTOS_TOOLS_HTTP_TIMEOUT_S", cls.timeout_s)
        if not 0 < timeout <= 120:
            raise ConfigError(f"EVENTOS_TOOLS_HTTP_TIMEOUT_S must be in (0, 120], got {timeout}")
        return cls(
            timeout_s=timeout,
            max_response_bytes=env_int(
                env, "EVENTOS_TOOLS_HTTP_MAX_RESPONSE", cls.max_response_bytes
            ),
            max_body_shown=env_int(env, "EVENTOS_TOOLS_HTTP_MAX_SHOWN", cls.max_body_shown),
        )


# What the chart says about the deployment a process belongs to (runtime/build.py's release).
IMAGE_TAG_VAR = "EVENTOS_IMAGE_TAG"
CHART_VERSION_VAR = "EVENTOS_CHART_VERSION"
TEMPORAL_SERVER_VAR = "EVENTOS_TEMPORAL_SERVER"
# The Temporal server version a service image pins (the Makefile's TEMPORAL_SERVER_VERSION, which
# `make images` bakes into each service image's environment and label): the version the
# Kubernetes upgrader moves an instance's Temporal to (docs/upgrades.md#temporal-on-kubernetes).
TEMPORAL_PIN_VAR = "EVENTOS_TEMPORAL_PIN"
RELEASE_PART_MAX = 128


# The drill switch (docs/upgrades.md#drill-a-failure): a service started with it answers /readyz
# 503 (`failed: {"drill": "injected"}`) while everything else works. `eventosctl upgrade
# --inject-readiness-failure` sets it on the new release only, so its rollback can be watched.
DRILL_READINESS_FAILURE_VAR = "EVENTOS_DRILL_READINESS_FAILURE"


@dataclass(frozen=True)
class ReleaseSettings:
    """The deployment's parts of a release, as the chart sets them: `EVENTOS_IMAGE_TAG`,
    `EVENTOS_CHART_VERSION`, `EVENTOS_TEMPORAL_SERVER` (each empty when unset, as for a process
    started by hand or by `make run`; bounded to 128 characters), and the image's own
    `EVENTOS_TEMPORAL_PIN` (the Temporal server version it was built for; empty outside an
    image)."""

    image_tag: str = ""
    chart: str = ""
    temporal_server: str = ""
    # The drill switch (DRILL_READINESS_FAILURE_VAR): this release fails its readiness check.
    drill_readiness_failure: bool = False
    temporal_pin: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReleaseSettings:
        env = os.environ if env is None else env

        def named(var: str) -> str:
            return env.get(var, "").strip()[:RELEASE_PART_MAX]

        return cls(named(IMAGE_TAG_VAR), named(CHART_VERSION_VAR), named(TEMPORAL_SERVER_VAR),
                   _bool(env, DRILL_READINESS_FAILURE_VAR, False),
                   named(TEMPORAL_PIN_VAR))  # fmt: skip


@dataclass(frozen=True)
class OutboundSettings:
    """`EVENTOS_OUTBOUND_ALLOW_PRIVATE`: let tools and polls reach private addresses (a test
    harness, an instance whose APIs live on its own network). `EVENTOS_OUTBOUND_CA_FILE`: a PEM
    bundle trusted by their TLS besides the public roots (an organisation's own CA)."""

    allow_private: bool = False
    ca_file: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OutboundSettings:
        env = os.environ if env is None else env
        ca_file = env.get("EVENTOS_OUTBOUND_CA_FILE") or None
        if ca_file is not None and not os.path.isfile(ca_file):
            raise ConfigError(f"EVENTOS_OUTBOUND_CA_FILE: no such file {ca_file!r}")
        return cls(allow_private=_bool(env, "EVENTOS_OUTBOUND_ALLOW_PRIVATE", False),
                   ca_file=ca_file)  # fmt: skip


@dataclass(frozen=True)
class AlarmSettings:
    """Alarms (SPEC §10): the shortest `repeat.every_s` the tool accepts, how late a fired alarm
    must be for its text to carry a lateness note, and how many rows one `fire_due` moves."""

    min_every_s: int = 60
    late_note_after_s: float = 60.0
    fire_batch: int = 100

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AlarmSettings:
        env = os.environ if env is None else env
        late = _float(env, "EVENTOS_ALARMS_LATE_NOTE_AFTER_S", cls.late_note_after_s)
        if late < 0:
            raise ConfigError(f"EVENTOS_ALARMS_LATE_NOTE_AFTER_S must be ≥ 0, got {late}")
        return cls(
            min_every_s=env_int(env, "EVENTOS_ALARMS_MIN_EVERY_S", cls.min_every_s),
            late_note_after_s=late,
            fire_batch=env_int(env, "EVENTOS_ALARMS_FIRE_BATCH", cls.fire_batch),
        )


@dataclass(frozen=True)
class MessagingSettings:
    """Messaging between employees (SPEC §10, §15): how long a message or task may wait
    undelivered before it expires and its sender is told (`EVENTOS_MESSAGING_STALE_AFTER_S`)."""

    stale_after_s: float = names.IPC_STALE_AFTER_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MessagingSettings:
        env = os.environ if env is None else env
        stale = _float(env, "EVENTOS_MESSAGING_STALE_AFTER_S", cls.stale_after_s)
        if stale <= 0:
            raise ConfigError(f"EVENTOS_MESSAGING_STALE_AFTER_S must be > 0, got {stale}")
        return cls(stale_after_s=stale)


@dataclass(frozen=True)
class HttpBounds:
    """Defaults pass real traffic untouched: headers of 32 KiB (providers send a few KiB),
    10 s for them, 30 s of silence within a body, 1,024 connections.

    A body also has a total deadline (120 s: bench/soak.py's 10 MiB uploads take 60 s) and a
    minimum rate (1 KiB/s on average once 10 s have passed), so a body trickled a byte at a
    time holds its request for seconds, not for ever.

    Requests in flight are capped per class of caller, so one class filling its cap never
    refuses another: webhooks and channel hooks (`hooks_max_in_flight`, 512: 300 slow 10 MiB
    uploads and normal traffic beside them), event streams (`streams_max_in_flight`, 256, each
    open for as long as its client reads) and everything else, the owner API among it
    (`max_in_flight`, 256). A service declares which of its paths are hooks and streams
    (`eventos.runtime.http_bounds.CapClass`); in the others every request is of the last.

    An idle kept-alive connection is closed after `keep_alive_s` (20 s): longer than clients
    keep an idle connection themselves (httpx and the CLI 5 s), so the client is the one to
    drop it. With uvicorn's 5 s both ends gave up at the same moment, and a request a client
    sent on a connection the server was closing failed with a read error."""

    max_header_bytes: int = 32 * 1024
    header_timeout_s: float = 10.0
    keep_alive_s: int = 20  # seconds
    body_idle_timeout_s: float = 30.0
    max_in_flight: int = 256
    max_connections: int = 1024
    body_timeout_s: float = 120.0
    body_min_rate: int = 1024  # bytes per second, averaged over the body so far
    body_rate_grace_s: float = 10.0  # the rate is not asked for before this
    hooks_max_in_flight: int = 512
    streams_max_in_flight: int = 256

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HttpBounds:
        env = os.environ if env is None else env
        d = cls()
        values: dict[str, Any] = {}
        for name, default in d.__dict__.items():
            var = f"EVENTOS_HTTP_{name.upper()}"
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            try:
                value = type(default)(raw)
            except ValueError:
                raise ConfigError(f"{var} must be a number, got {raw!r}") from None
            if value <= 0:
                raise ConfigError(f"{var} must be positive, got {raw!r}")
            values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class IngressBuffers:
    """Where large webhook bodies wait while they arrive (`EVENTOS_INGRESS_SPOOL_DIR`, default
    the system's temporary directory) and how many records may wait for a group commit
    (`EVENTOS_INGRESS_COMMIT_QUEUE_MAX`, 4,096; beyond it 503)."""

    spool_dir: Path | None = None
    commit_queue_max: int = names.COMMIT_QUEUE_MAX

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> IngressBuffers:
        env = os.environ if env is None else env
        spool = env.get("EVENTOS_INGRESS_SPOOL_DIR")
        queue = env_int(env, "EVENTOS_INGRESS_COMMIT_QUEUE_MAX", names.COMMIT_QUEUE_MAX)
        return cls(Path(spool) if spool else None, queue)


LLM_ENDPOINTS_VAR = "EVENTOS_LLM_ENDPOINTS"
OUTBOX_KEYS_VAR = "EVENTOS_OUTBOX_KEYS"
OUTBOX_KEYS_FILE_VAR = "EVENTOS_OUTBOX_KEYS_FILE"


@dataclass(frozen=True)
class LlmEndpointSettings:
    """`EVENTOS_LLM_ENDPOINTS`: the JSON document of the operator's LLM endpoints (empty: none);
    `eventos.llm.endpoints.LlmEndpoints` parses it."""

    document: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LlmEndpointSettings:
        env = os.environ if env is None else env
        return cls(env.get(LLM_ENDPOINTS_VAR, "").strip())


@dataclass(frozen=True)
class OutboxKeySettings:
    """`EVENTOS_OUTBOX_KEYS` or `EVENTOS_OUTBOX_KEYS_FILE` (a mounted Secret): the keys that
    seal outbox recipients, as text with the variable it came from; `eventos.outbox.keys`
    parses it. Required by the services that read or write recipients."""

    text: str = field(default="", repr=False)
    source: str = OUTBOX_KEYS_VAR

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OutboxKeySettings:
        env = os.environ if env is None else env
        var, file_var = OUTBOX_KEYS_VAR, OUTBOX_KEYS_FILE_VAR
        raw, path = env.get(var, "").strip(), env.get(file_var, "").strip()
        if raw and path:
            raise ConfigError(f"set {var} or {file_var}, not both")
        if path:
            try:
                return cls(Path(path).read_text(), file_var)
            except OSError as exc:
                raise ConfigError(f"{file_var}: cannot read {path}: {exc.strerror}") from None
        if raw:
            return cls(raw, var)
        raise ConfigError(
            f"{var} (or {file_var}) is required: this service writes or reads outbox "
            "recipients, which are encrypted at rest"
        )


@dataclass(frozen=True)
class SupervisionSettings:
    """Restart intensity, `degraded` and the watchdogs (SPEC §12), each field from
    `EVENTOS_SUPERVISION_<FIELD>` (`BACKOFF_S` as seconds separated by commas)."""

    backoff_after: int = 3  # failed turns of a thread within backoff_window_s back it off
    backoff_window_s: float = 600.0
    backoff_s: tuple[float, ...] = (60.0, 300.0, 1800.0)  # the 1st, 2nd, 3rd+ in a row
    quarantine_after: int = 5  # failed turns of a thread within quarantine_window_s
    quarantine_window_s: float = 3600.0
    degraded_share: float = 0.3  # of an employee's turns failing in degraded_window_s …
    degraded_min_failed: int = 10  # … with at least this many failed
    degraded_window_s: float = 900.0
    degraded_quarantined: int = 3  # or this many threads quarantined
    router_stalled_s: float = 30.0  # the oldest accepted ingress row older than this
    window_idle_s: float = 300.0  # a full window with no turn and no slot asked for this long
    stuck_intent_attempts: int = 8  # an intent still applying after this many attempts
    stuck_send_attempts: int = 5  # an outbox row still unsent after this many claims
    stuck_turn_s: float = 600.0  # a turn holding a slot with no step progress for this long
    pass_s: float = 5.0  # the relay's supervision pass runs this often
    upkeep_s: float = 300.0  # the relay's instance-wide upkeep sweep runs this often

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SupervisionSettings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, default in cls().__dict__.items():
            var = f"EVENTOS_SUPERVISION_{name.upper()}"
            raw = env.get(var, "").strip()
            if raw:
                values[name] = _supervision_value(var, raw, default)
        share = values.get("degraded_share", cls.degraded_share)
        if share > 1:
            raise ConfigError(f"EVENTOS_SUPERVISION_DEGRADED_SHARE must be ≤ 1, got {share:g}")
        return cls(**values)


def _supervision_value(var: str, raw: str, default: object) -> object:
    """A positive number (or, for a tuple default, positive numbers separated by commas)."""
    try:
        if isinstance(default, tuple):
            value: Any = tuple(float(part) for part in raw.split(","))
            low = min(value)
        else:
            value = type(default)(raw)  # type: ignore[call-arg]
            low = value
    except ValueError:
        raise ConfigError(f"{var} must be a positive number, got {raw!r}") from None
    if low <= 0:
        raise ConfigError(f"{var} must be positive, got {raw!r}")
    return value


@dataclass(frozen=True)
class UpgradeSettings:
    """The upgrader's bounds (`EVENTOS_UPGRADE_*`): how long the new release has to answer ready
    (READY_S), the previous release after a rollback (ROLLBACK_READY_S), to stop (STOP_S), to
    replay the open runs (REPLAY_S), to install (INSTALL_S), how
    many open runs the replay gate reads at most (REPLAY_MAX_RUNS); `uv` (UV) builds a release's
    environment from its lock (the Makefile's own, `.tools/bin/uv`, when unset)."""

    ready_s: float = 90.0
    rollback_ready_s: float = 180.0
    stop_s: float = 30.0
    replay_s: float = 300.0
    install_s: float = 600.0
    replay_max_runs: int = 5000
    uv: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> UpgradeSettings:
        env = os.environ if env is None else env
        seconds = {}
        for name in ("ready_s", "rollback_ready_s", "stop_s", "replay_s", "install_s"):
            var = f"EVENTOS_UPGRADE_{name.upper()}"
            value = _float(env, var, getattr(cls, name))
            if not 0 < value <= 3600:
                raise ConfigError(f"{var} must be between 0 and 3600 seconds, got {value:g}")
            seconds[name] = value
        runs = env_int(env, "EVENTOS_UPGRADE_REPLAY_MAX_RUNS", cls.replay_max_runs)
        return cls(**seconds, replay_max_runs=runs, uv=env.get("EVENTOS_UPGRADE_UV", "").strip())


# Where a pod finds its own namespace (the ServiceAccount volume; the CronJob mounts its token).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class KubernetesUpgradeSettings:
    """Which Kubernetes instance `eventosctl upgrade` drives (docs/upgrades.md#on-kubernetes):
    the namespace (EVENTOS_UPGRADE_NAMESPACE; in a pod, its own), the chart's release name
    (EVENTOS_UPGRADE_RELEASE: the `app.kubernetes.io/instance` label of its Deployments), and how
    to reach the API: in-cluster (a pod: KUBERNETES_SERVICE_HOST is set) or the kubeconfig file
    EVENTOS_UPGRADE_KUBECONFIG (empty: the client's default, ~/.kube/config)."""

    namespace: str = ""
    release: str = ""
    kubeconfig: str = ""
    in_cluster: bool = False

    @property
    def chosen(self) -> bool:
        """Whether the upgrader drives Kubernetes rather than a local instance."""
        return bool(self.in_cluster or self.namespace or self.kubeconfig)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KubernetesUpgradeSettings:
        env = os.environ if env is None else env
        in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST", "").strip())
        namespace = env.get("EVENTOS_UPGRADE_NAMESPACE", "").strip()
        if not namespace and in_cluster and POD_NAMESPACE_FILE.is_file():
            namespace = POD_NAMESPACE_FILE.read_text().strip()
        return cls(namespace, env.get("EVENTOS_UPGRADE_RELEASE", "").strip(),
                   env.get("EVENTOS_UPGRADE_KUBECONFIG", "").strip(), in_cluster)  # fmt: skip


BACKUP_STORE_VAR = "EVENTOS_BACKUP_STORE"
BACKUP_SCHEMES = ("s3", "file")
# The instance's databases a backup dumps, by role (the app's; Temporal's two at tier L).
APP_DATABASE, TEMPORAL_DATABASE, VISIBILITY_DATABASE = "app", "temporal", "temporal_visibility"


@dataclass(frozen=True)
class BackupTarget:
    """One database a backup dumps: its role in the instance and where it is."""

    name: str
    url: str = field(repr=False)


def _secret_text(env: Mapping[str, str], var: str) -> str:
    """`var`, or the file `var`_FILE names (a mounted Secret), stripped; "" when neither."""
    raw, path = env.get(var, "").strip(), env.get(var + "_FILE", "").strip()
    if raw and path:
        raise ConfigError(f"set {var} or {var}_FILE, not both")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{var}_FILE: cannot read {path}: {exc.strerror}") from None
    return raw


def _with_password(url: str, password: str) -> str:
    return psycopg.conninfo.make_conninfo(url, password=password)


@dataclass(frozen=True)
class BackupSettings:
    """Backups and restore (docs/backups.md), from `EVENTOS_BACKUP_*`: the store
    (`s3://bucket/prefix` with an endpoint and credentials, or `file:///path`), the databases
    dumped (the app's from EVENTOS_DATABASE_URL; Temporal's when their URLs are set), where
    pg_dump is, the Temporal namespace a restore reconciles, and a deadline on every step."""

    store: str
    databases: tuple[BackupTarget, ...]
    s3_endpoint: str = ""  # http(s)://host:port of the S3-compatible server
    s3_region: str = ""
    s3_access_key: str = field(default="", repr=False)
    s3_secret_key: str = field(default="", repr=False)
    pg_bin: Path | None = None  # the folder of pg_dump and pg_restore (None: found, see fleet)
    temporal: TemporalSettings | None = None  # the namespace a restore reconciles
    dump_timeout_s: float = 1800.0  # one database's pg_dump (or pg_restore)
    transfer_timeout_s: float = 600.0  # one file to or from the store
    call_timeout_s: float = 30.0  # one small call: a manifest, a listing, a connection
    rearm_wait_s: float = 120.0  # a restore waits this long for the relay to apply its re-arm
    keep: int = 14  # backups kept; older complete ones are removed after a new one

    def __post_init__(self) -> None:
        scheme = self.store.split("://", 1)[0] if "://" in self.store else ""
        if scheme not in BACKUP_SCHEMES:
            raise ConfigError(
                f"{BACKUP_STORE_VAR} must be s3://bucket[/prefix] or file:///path, "
                f"got {self.store!r}"
            )
        if scheme == "s3" and not (self.s3_endpoint and self.s3_access_key and self.s3_secret_key):
            raise ConfigError(
                "an s3:// backup store needs EVENTOS_BACKUP_S3_ENDPOINT, "
                "EVENTOS_BACKUP_S3_ACCESS_KEY and EVENTOS_BACKUP_S3_SECRET_KEY (or their _FILE)"
            )
        if not any(t.name == APP_DATABASE for t in self.databases):
            raise ConfigError("a backup needs the app database (EVENTOS_DATABASE_URL)")
        for var, value in (("DUMP_TIMEOUT_S", self.dump_timeout_s),
                           ("TRANSFER_TIMEOUT_S", self.transfer_timeout_s),
                           ("CALL_TIMEOUT_S", self.call_timeout_s),
                           ("REARM_WAIT_S", self.rearm_wait_s)):  # fmt: skip
            _bounded(f"EVENTOS_BACKUP_{var}", value, 1, 86_400)
        _bounded("EVENTOS_BACKUP_KEEP", self.keep, 1, 10_000)

    def app_url(self) -> str:
        """The app database's URL."""
        return next(t.url for t in self.databases if t.name == APP_DATABASE)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BackupSettings:
        env = os.environ if env is None else env
        databases = [BackupTarget(APP_DATABASE, _get(env, "EVENTOS_DATABASE_URL"))]
        # Temporal's databases: URLs, or conninfos without the password with the password in
        # EVENTOS_BACKUP_TEMPORAL_PASSWORD(_FILE) (the chart mounts the server's Secret).
        password = _secret_text(env, "EVENTOS_BACKUP_TEMPORAL_PASSWORD")
        for name in (TEMPORAL_DATABASE, VISIBILITY_DATABASE):
            url = _secret_text(env, f"EVENTOS_BACKUP_{name.upper()}_DATABASE_URL")
            if url and password:
                url = _with_password(url, password)
            if url:
                databases.append(BackupTarget(name, url))
        pg_bin = env.get("EVENTOS_BACKUP_PG_BIN", "").strip()
        return cls(
            store=_get(env, BACKUP_STORE_VAR).strip(),
            databases=tuple(databases),
            s3_endpoint=env.get("EVENTOS_BACKUP_S3_ENDPOINT", "").strip(),
            s3_region=env.get("EVENTOS_BACKUP_S3_REGION", "").strip(),
            s3_access_key=_secret_text(env, "EVENTOS_BACKUP_S3_ACCESS_KEY"),
            s3_secret_key=_secret_text(env, "EVENTOS_BACKUP_S3_SECRET_KEY"),
            pg_bin=Path(pg_bin) if pg_bin else None,
            temporal=TemporalSettings.from_env(env) if env.get("TEMPORAL_ADDRESS") else None,
            dump_timeout_s=_float(env, "EVENTOS_BACKUP_DUMP_TIMEOUT_S", cls.dump_timeout_s),
            transfer_timeout_s=_float(
                env, "EVENTOS_BACKUP_TRANSFER_TIMEOUT_S", cls.transfer_timeout_s
            ),
            call_timeout_s=_float(env, "EVENTOS_BACKUP_CALL_TIMEOUT_S", cls.call_timeout_s),
            rearm_wait_s=_float(env, "EVENTOS_BACKUP_REARM_WAIT_S", cls.rearm_wait_s),
            keep=_int(env, "EVENTOS_BACKUP_KEEP", cls.keep),
        )
