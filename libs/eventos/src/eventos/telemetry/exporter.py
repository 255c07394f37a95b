"""The export thread of a service: every interval, the registry's families as OTLP metrics and
the errors counted since the last export as OTLP log records, to the central collector."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from eventos.telemetry.bridge import RegistryBridge
from eventos.telemetry.errors import ErrorCounter
from eventos.telemetry.settings import TelemetrySettings
from eventos.telemetry.temporal_metrics import TemporalMetrics

log = logging.getLogger(__name__)
DRAIN_S = 1.0  # how often the Temporal metric buffer is drained (its bound is per drain)
STOP_S = 5.0  # a stopping service waits this long for its last export


def exporters(settings: TelemetrySettings) -> tuple[MetricExporter, LogRecordExporter]:
    """The OTLP metric and log exporters of the configured protocol."""
    # Imported here: a service with no endpoint does not pay for the gRPC and HTTP clients.
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcMetrics,
    )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetrics,
    )

    timeout = settings.timeout_ms / 1000
    headers = dict(settings.headers)
    if settings.protocol == "http/protobuf":
        base = settings.endpoint.rstrip("/")
        return (HttpMetrics(f"{base}/v1/metrics", headers=headers, timeout=timeout),
                HttpLogs(f"{base}/v1/logs", headers=headers, timeout=timeout))  # fmt: skip
    insecure = settings.endpoint.startswith("http://")
    end = settings.endpoint
    return (GrpcMetrics(end, insecure=insecure, headers=headers, timeout=timeout),
            GrpcLogs(end, insecure=insecure, headers=headers, timeout=timeout))  # fmt: skip


@dataclass
class Exporter:
    """Drains the Temporal buffer every second; exports every `interval_ms` and at stop."""

    settings: TelemetrySettings
    registry: CollectorRegistry
    temporal: TemporalMetrics
    errors: ErrorCounter
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _metrics: MetricExporter | None = None
    _logs: LoggerProvider | None = None
    _bridge: RegistryBridge | None = None

    def start(self) -> None:
        """Start the thread (and, with an endpoint, the OTLP exporters)."""
        if self.settings.enabled:
            resource = Resource(self.settings.resource)
            self._metrics, log_exporter = exporters(self.settings)
            self._logs = LoggerProvider(resource=resource)
            self._logs.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
            self._bridge = RegistryBridge(self.registry, resource)
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Export once more, then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_S + self.settings.timeout_ms / 1000)
        if self._metrics is not None:
            self._metrics.shutdown()
        if self._logs is not None:
            self._logs.shutdown()

    def _run(self) -> None:
        interval = self.settings.interval_ms / 1000
        next_export = time.monotonic() + interval
        while not self._stop.wait(DRAIN_S):
            self.temporal.drain()
            if time.monotonic() >= next_export:
                self.export()
                next_export = time.monotonic() + interval
        self.temporal.drain()
        self.export()

    def event(self, name: str, outcome: str) -> None:
        """Send one event now (`event.name`, `outcome`, an empty body): an upgrade's outcome."""
        if self._logs is None:
            return
        attributes = {"event.name": name, "outcome": outcome}
        self._logs.get_logger("eventos.events").emit(
            body="", severity_number=SeverityNumber.INFO, severity_text="INFO",
            attributes=attributes,
        )  # fmt: skip
        self._logs.force_flush(self.settings.timeout_ms)

    def export(self) -> None:
        """Send the metrics and the error reports now (a failed send is logged and dropped:
        the next export carries the cumulative values again)."""
        if self._metrics is None or self._logs is None or self._bridge is None:
            return
        try:
            self._metrics.export(self._bridge.collect(), timeout_millis=self.settings.timeout_ms)
            reports = self.errors.take()
            logger = self._logs.get_logger("eventos.errors")
            for report in reports:
                logger.emit(body="", severity_number=SeverityNumber.ERROR, severity_text="ERROR",
                            attributes=report.attributes())  # fmt: skip
            if reports:
                self._logs.force_flush(self.settings.timeout_ms)
        except Exception as exc:  # the export thread must outlive a bad export
            log.warning("telemetry export failed: %s", type(exc).__name__)
