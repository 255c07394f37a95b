"""What a service exports to the fleet's collector (SPEC §13) and how it logs: metrics (every
family of the Prometheus registry, the Temporal SDK's runtime metrics among them) and error
reports over OTLP, configured by the standard `OTEL_*` variables; logs on stderr."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from prometheus_client import REGISTRY
from temporalio.runtime import Runtime

from eventos.telemetry.errors import ErrorCounter, install
from eventos.telemetry.exporter import Exporter
from eventos.telemetry.logs import configure_logging
from eventos.telemetry.settings import LogSettings, TelemetrySettings
from eventos.telemetry.temporal_metrics import TemporalMetrics

__all__ = ["Exporter", "LogSettings", "TelemetrySettings", "configure_logging", "started"]


@contextlib.contextmanager
def started(service: str, env: Mapping[str, str] | None = None) -> Iterator[Exporter]:
    """A service process's logging and telemetry, from boot to its last export at exit.

    The Temporal runtime with the metric buffer becomes the default, so every client the
    process connects afterwards reports into it."""
    configure_logging(LogSettings.from_env(env))
    settings = TelemetrySettings.from_env(service, env)
    temporal = TemporalMetrics()
    Runtime.set_default(temporal.runtime(), error_if_already_set=False)
    REGISTRY.register(temporal)
    counter = ErrorCounter()
    uninstall = install(counter)
    exporter = Exporter(settings, REGISTRY, temporal, counter)
    exporter.start()
    try:
        yield exporter
    finally:
        exporter.stop()
        uninstall()
        REGISTRY.unregister(temporal)
