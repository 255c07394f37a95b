"""The services' own filter on what leaves an instance (SPEC §13): resource attributes,
metric labels, error reports and logs, each checked with canary strings."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary

from eventos.errors import ConfigError
from eventos.telemetry.allowlist import DATAPOINT_KEYS, LOG_KEYS, RESOURCE_KEYS, violations
from eventos.telemetry.bridge import RegistryBridge
from eventos.telemetry.errors import ErrorCounter
from eventos.telemetry.logs import JsonFormatter, TextFormatter, configure_logging
from eventos.telemetry.settings import LogSettings, TelemetrySettings

ROOT = Path(__file__).resolve().parents[3]
CANARY = "canary-7Qx2"


def test_the_allowlists_are_the_collector_charts() -> None:
    values = yaml.safe_load((ROOT / "deploy/helm/eventos-collector/values.yaml").read_text())
    allow = values["allowlist"]
    assert sorted(allow["resource"]) == sorted(RESOURCE_KEYS)
    assert sorted(allow["datapoint"]) == sorted(DATAPOINT_KEYS)
    assert sorted(allow["log"]) == sorted(LOG_KEYS)


def test_resource_attributes_keep_only_the_global_tags() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
        "OTEL_RESOURCE_ATTRIBUTES": "service.namespace=eventos,service.version=1.2.3,"
        f"eventos.instance.id=inst-7f3a,eventos.tier=L,employee.name={CANARY},"
        f"host.name=owner-{CANARY}",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{CANARY}",
    }
    settings = TelemetrySettings.from_env("relay", env)
    assert settings.resource == {
        "service.name": "eventos-relay",
        "service.namespace": "eventos",
        "service.version": "1.2.3",
        "eventos.instance.id": "inst-7f3a",
        "eventos.tier": "L",
    }
    assert settings.headers == {"authorization": f"Bearer {CANARY}"}
    assert CANARY not in repr(settings)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_RESOURCE_ATTRIBUTES": "eventos.instance.id=ACME Corp"}, "opaque id"),
        ({"EVENTOS_INSTANCE_ID": "jane.doe@example.com"}, "opaque id"),
        ({"EVENTOS_TIER": "M"}, "S or L"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "OTEL_METRIC_EXPORT_INTERVAL"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "novalue"}, "key=value"),
    ],
)
def test_bad_telemetry_settings_fail_at_boot(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TelemetrySettings.from_env("relay", env)


def test_no_endpoint_or_disabled_exports_nothing() -> None:
    assert not TelemetrySettings.from_env("relay", {}).enabled
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "true"}
    assert not TelemetrySettings.from_env("relay", env).enabled


def exported(registry: CollectorRegistry) -> dict[str, object]:
    """The OTLP protobuf of the registry's families, by metric name."""
    data = RegistryBridge(registry, Resource({"service.name": "eventos-test"})).collect()
    (rm,) = encode_metrics(data).resource_metrics
    return {m.name: m for sm in rm.scope_metrics for m in sm.metrics}


def test_every_family_of_the_registry_is_exported_with_allowlisted_labels() -> None:
    registry = CollectorRegistry()
    hist = Histogram("t_seconds", "h", ["outcome"], buckets=(0.1, 1), registry=registry)
    hist.labels("ok").observe(0.05)
    hist.labels("ok").observe(0.5)
    hist.labels("ok").observe(5)
    counter = Counter("t_rows", "c", ["outcome", "employee"], registry=registry)
    counter.labels("ok", f"{CANARY}-1").inc(2)
    counter.labels("ok", f"{CANARY}-2").inc(3)  # the off-list label is dropped: 5 in all
    Gauge("t_depth", "g", ["reason"], registry=registry).labels(f"a message {CANARY}").set(4)
    Info("t_build", "i", registry=registry).info({"version": "1", "queue": "workflows"})
    Summary("t_wait", "s", registry=registry).observe(2)
    metrics = exported(registry)
    assert sorted(metrics) == ["t_build_info", "t_depth", "t_rows", "t_seconds", "t_wait_count",
                               "t_wait_sum"]  # fmt: skip
    (point,) = metrics["t_seconds"].histogram.data_points  # type: ignore[attr-defined]
    assert (list(point.explicit_bounds), list(point.bucket_counts)) == ([0.1, 1], [1, 1, 1])
    assert (point.count, point.sum) == (3, 5.55)
    (rows,) = metrics["t_rows"].sum.data_points  # type: ignore[attr-defined]
    assert rows.as_double == 5 and metrics["t_rows"].sum.is_monotonic  # type: ignore[attr-defined]
    (depth,) = metrics["t_depth"].gauge.data_points  # type: ignore[attr-defined]
    assert {a.key: a.value.string_value for a in depth.attributes} == {"reason": "other"}
    assert CANARY not in str(metrics)


def boom(secret: str) -> None:
    raise ValueError(f"cannot parse {secret}")


def test_error_reports_carry_type_frames_and_count_never_the_message_or_locals() -> None:
    counter = ErrorCounter()
    logger = logging.getLogger("test.telemetry.errors")
    logger.addHandler(counter)
    try:
        for _ in range(3):
            try:
                boom(CANARY)
            except ValueError:
                logger.exception("failed on %s", CANARY)
        logger.warning("no exception here: %s", CANARY)
    finally:
        logger.removeHandler(counter)
    (report,) = counter.take()
    attrs = report.attributes()
    assert not violations(attrs, LOG_KEYS)
    assert attrs["exception.type"] == "ValueError" and attrs["error.count"] == 3
    assert attrs["code.function"] == "boom"
    assert str(attrs["code.filepath"]).endswith("test_telemetry.py")
    assert "test_telemetry.py" in str(attrs["exception.stacktrace"])
    assert CANARY not in json.dumps(attrs)
    assert counter.take() == []


def record(level: int) -> logging.LogRecord:
    try:
        boom(CANARY)
    except ValueError as exc:
        return logging.LogRecord("t", level, __file__, 1, "failed", (), (ValueError, exc,
                                 exc.__traceback__))  # fmt: skip
    raise AssertionError("unreachable")


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()])
def test_logs_at_info_and_above_show_an_exception_without_its_message(
    formatter: logging.Formatter,
) -> None:
    line = formatter.format(record(logging.ERROR))
    assert "ValueError" in line and "boom" in line and CANARY not in line
    assert CANARY in formatter.format(record(logging.DEBUG))


@pytest.mark.parametrize("form", ["text", "json"])
def test_the_operators_own_logs_show_an_exceptions_text_redacted(
    form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`EVENTOS_LOG_EXCEPTIONS=text` (the local instance's services): an RPC error's message is
    shown, not `(message not shown)`, and a credential in it is redacted by the handler."""
    settings = LogSettings.from_env({"EVENTOS_LOG_FORMAT": form, "EVENTOS_LOG_EXCEPTIONS": "text"})
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging(settings)
    try:
        try:
            raise RuntimeError(
                f"Connection refused to 127.0.0.1:7233 ({CANARY}) token=s3cr3t-v4lue"
            )
        except RuntimeError:
            logging.getLogger("eventos.test").error("poll failed", exc_info=True)
        err = capsys.readouterr().err
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert "Connection refused" in err and CANARY in err and "token=REDACTED" in err, err
    assert "s3cr3t" not in err and "message not shown" not in err


def test_json_logs_are_one_object_per_line() -> None:
    doc = json.loads(JsonFormatter().format(record(logging.WARNING)))
    assert doc["level"] == "WARNING" and doc["exception.type"] == "ValueError"
    assert doc["message"] == "failed"


def test_log_settings() -> None:
    assert LogSettings.from_env({}) == LogSettings("text", "INFO")
    assert LogSettings.from_env({"EVENTOS_LOG_FORMAT": "JSON", "EVENTOS_LOG_LEVEL": "debug"}) == (
        LogSettings("json", "DEBUG")
    )
    with pytest.raises(ConfigError, match="EVENTOS_LOG_FORMAT"):
        LogSettings.from_env({"EVENTOS_LOG_FORMAT": "xml"})
    with pytest.raises(ConfigError, match="EVENTOS_LOG_LEVEL"):
        LogSettings.from_env({"EVENTOS_LOG_LEVEL": "chatty"})
    assert LogSettings.from_env({"EVENTOS_LOG_EXCEPTIONS": "TEXT"}).exceptions == "text"
    with pytest.raises(ConfigError, match="EVENTOS_LOG_EXCEPTIONS"):
        LogSettings.from_env({"EVENTOS_LOG_EXCEPTIONS": "everything"})


def test_an_event_carries_its_name_and_outcome_only() -> None:
    """An upgrade's outcome leaves as an event of allowlisted attributes and an empty body."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

    from eventos.telemetry.exporter import Exporter
    from eventos.telemetry.temporal_metrics import TemporalMetrics

    settings = TelemetrySettings.from_env("eventosctl", {})
    exporter = Exporter(settings, CollectorRegistry(), TemporalMetrics(), ErrorCounter())
    memory = InMemoryLogRecordExporter()
    exporter._logs = LoggerProvider()
    exporter._logs.add_log_record_processor(SimpleLogRecordProcessor(memory))
    exporter.event("eventos.upgrade", "rolled_back")
    (record,) = memory.get_finished_logs()
    attrs = dict(record.log_record.attributes or {})
    assert attrs == {"event.name": "eventos.upgrade", "outcome": "rolled_back"}
    assert not violations(attrs, LOG_KEYS) and record.log_record.body == ""
