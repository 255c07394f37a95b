"""GrpcIngressSettings: read once at boot, failing there with the variable's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventos import names
from eventos.errors import ConfigError
from eventos.settings import GrpcIngressSettings, is_loopback
from eventos.spec.model import Trigger


def test_defaults_let_a_64_kb_envelope_through_and_bound_the_rest() -> None:
    s = GrpcIngressSettings.from_env({})
    assert s.max_message_bytes == 80 * 1024 > names.ENVELOPE_MAX_BYTES
    assert (s.read_ahead_events, s.read_ahead_bytes) == (1000, 4 * 1024 * 1024)
    assert (s.max_streams, s.max_streams_per_driver, s.max_concurrent_rpcs) == (64, 4, 256)
    assert s.internal_token is None and not s.tls and not s.insecure
    options = dict(s.server_options())
    assert options["grpc.max_receive_message_length"] == 80 * 1024
    assert options["grpc.keepalive_time_ms"] == 30_000
    assert options["grpc.max_connection_idle_ms"] == 300_000
    assert options["grpc.max_connection_age_ms"] == 1_800_000


def test_every_variable_is_read() -> None:
    env = {
        "EVENTOS_INTERNAL_TOKEN": "internal-token-0123456789",
        "EVENTOS_INGRESS_GRPC_INSECURE": "true",
        "EVENTOS_INGRESS_GRPC_MAX_MESSAGE_BYTES": "100000",
        "EVENTOS_INGRESS_PUBLISH_READ_AHEAD_EVENTS": "500",
        "EVENTOS_INGRESS_PUBLISH_READ_AHEAD_BYTES": "1048576",
        "EVENTOS_INGRESS_PUBLISH_MAX_STREAMS": "8",
        "EVENTOS_INGRESS_GRPC_MAX_CONCURRENT_RPCS": "16",
        "EVENTOS_INGRESS_GRPC_KEEPALIVE_TIME_S": "45",
        "EVENTOS_INGRESS_GRPC_KEEPALIVE_TIMEOUT_S": "5",
        "EVENTOS_INGRESS_GRPC_MAX_CONNECTION_IDLE_S": "60",
        "EVENTOS_INGRESS_PUBLISH_MAX_STREAMS_PER_DRIVER": "2",
        "EVENTOS_INGRESS_GRPC_MAX_CONNECTION_AGE_S": "900",
        "EVENTOS_INGRESS_GRPC_MAX_CONNECTION_AGE_GRACE_S": "30",
    }
    s = GrpcIngressSettings.from_env(env)
    assert s == GrpcIngressSettings(
        internal_token="internal-token-0123456789", insecure=True, max_message_bytes=100_000,
        read_ahead_events=500, read_ahead_bytes=1_048_576, max_streams=8,
        max_concurrent_rpcs=16, keepalive_time_s=45, keepalive_timeout_s=5,
        max_connection_idle_s=60, max_streams_per_driver=2, max_connection_age_s=900,
        max_connection_age_grace_s=30,
    )  # fmt: skip
    assert "internal-token" not in repr(s)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"EVENTOS_INTERNAL_TOKEN": "short"}, "EVENTOS_INTERNAL_TOKEN"),
        (
            {"EVENTOS_INGRESS_GRPC_MAX_MESSAGE_BYTES": "big"},
            "EVENTOS_INGRESS_GRPC_MAX_MESSAGE_BYTES",
        ),
        ({"EVENTOS_INGRESS_PUBLISH_READ_AHEAD_EVENTS": "1001"}, "READ_AHEAD_EVENTS"),
        ({"EVENTOS_INGRESS_PUBLISH_READ_AHEAD_BYTES": "10"}, "READ_AHEAD_BYTES"),
        ({"EVENTOS_INGRESS_PUBLISH_MAX_STREAMS": "0"}, "EVENTOS_INGRESS_PUBLISH_MAX_STREAMS"),
        ({"EVENTOS_INGRESS_GRPC_INSECURE": "maybe"}, "EVENTOS_INGRESS_GRPC_INSECURE"),
        ({"EVENTOS_INGRESS_GRPC_TLS_CERT_FILE": "/nonexistent"}, "TLS_CERT_FILE"),
    ],
)
def test_a_bad_value_fails_at_boot_naming_its_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        GrpcIngressSettings.from_env(env)


def test_a_certificate_needs_its_key(tmp_path: Path) -> None:
    cert = tmp_path / "tls.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match="TLS_KEY_FILE: set both or neither"):
        GrpcIngressSettings.from_env({"EVENTOS_INGRESS_GRPC_TLS_CERT_FILE": str(cert)})


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "localhost"])
def test_plaintext_is_allowed_on_loopback(host: str) -> None:
    assert is_loopback(host)
    GrpcIngressSettings().check_transport(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::", "ingress.example"])
def test_plaintext_off_loopback_is_refused_unless_declared(host: str) -> None:
    with pytest.raises(ConfigError) as info:
        GrpcIngressSettings().check_transport(host)
    for variable in ("EVENTOS_INGRESS_GRPC_TLS_CERT_FILE", "EVENTOS_INGRESS_GRPC_INSECURE"):
        assert variable in str(info.value)
    GrpcIngressSettings(insecure=True).check_transport(host)
    GrpcIngressSettings(tls_cert=b"c", tls_key=b"k").check_transport(host)


def test_no_trigger_kind_can_declare_an_internal_or_edge_source() -> None:
    kinds = set(Trigger.model_fields["kind"].annotation.__args__)  # type: ignore[union-attr]
    assert kinds.isdisjoint(names.INTERNAL_SOURCE_KINDS)
    assert set(names.HTTP_EDGE_SOURCE_KINDS) <= kinds  # the HTTP edge's own triggers
