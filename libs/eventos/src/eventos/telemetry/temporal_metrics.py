"""The Temporal SDK's runtime telemetry (poll results, schedule-to-start per queue, sticky
cache, slots) in the process's Prometheus registry: served on /metrics and exported over OTLP
with every other family.

The SDK's Core buffers metric updates in a `MetricBuffer`; `drain` moves them into cumulative
series here (counters add their deltas, gauges keep the last value, histograms count into fixed
buckets) and `collect` serves those series to prometheus_client. Labels are cut to the
allowlist on the way in (task_queue becomes `queue`), so a workflow id can never become one.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    LogForwardingConfig,
    LoggingConfig,
    MetricBuffer,
    MetricBufferDurationFormat,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from eventos.telemetry.allowlist import datapoint_attributes

# Updates Core may buffer between two drains (one a second): a busy worker makes a few
# thousand a second; past the bound Core drops updates and logs it.
BUFFER_SIZE = 200_000
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
COUNT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
Labels = tuple[tuple[str, str], ...]


@dataclass
class _Series:
    kind: int
    help: str
    seconds: bool
    values: dict[Labels, float] = field(default_factory=dict)
    buckets: dict[Labels, list[float]] = field(default_factory=dict)
    sums: dict[Labels, float] = field(default_factory=dict)

    @property
    def bounds(self) -> tuple[float, ...]:
        return SECONDS_BUCKETS if self.seconds else COUNT_BUCKETS

    def add(self, labels: Labels, value: float) -> None:
        if self.kind == BUFFERED_METRIC_KIND_COUNTER:
            self.values[labels] = self.values.get(labels, 0.0) + value
        elif self.kind == BUFFERED_METRIC_KIND_GAUGE:
            self.values[labels] = value
        else:
            counts = self.buckets.setdefault(labels, [0.0] * (len(self.bounds) + 1))
            counts[bisect_left(self.bounds, value)] += 1
            self.sums[labels] = self.sums.get(labels, 0.0) + value


@dataclass(eq=False)  # prometheus_client keeps collectors in a dict
class TemporalMetrics(Collector):
    """A `MetricBuffer`'s updates, kept as Prometheus series."""

    buffer: MetricBuffer = field(
        default_factory=lambda: MetricBuffer(BUFFER_SIZE, MetricBufferDurationFormat.SECONDS)
    )
    _series: dict[str, _Series] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _runtime: Runtime | None = None

    def runtime(self) -> Runtime:
        """The Temporal runtime whose metrics go to this buffer, and whose own (Core's) logs go
        to the Python logger `temporalio.core` (so they take the service's log format)."""
        if self._runtime is None:
            core_logs = LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")),
            )
            config = TelemetryConfig(logging=core_logs, metrics=self.buffer,
                                     attach_service_name=False)  # fmt: skip
            self._runtime = Runtime(telemetry=config)
        return self._runtime

    def describe(self) -> Iterator[Metric]:
        # Nothing to declare at registration: the families appear as Core reports them.
        return iter(())

    def drain(self) -> None:
        """Move every buffered update into the series."""
        if self._runtime is None:
            return
        with self._lock:
            for update in self.buffer.retrieve_updates():
                metric = update.metric
                series = self._series.get(metric.name)
                if series is None:
                    seconds = (metric.unit or "") in ("s", "duration", "seconds")
                    series = _Series(metric.kind, metric.description or metric.name, seconds)
                    self._series[metric.name] = series
                labels = {k: str(v) for k, v in update.attributes.items()}
                series.add(tuple(sorted(datapoint_attributes(labels).items())), update.value)

    def collect(self) -> Iterator[Metric]:
        self.drain()
        with self._lock:
            return iter([_family(name, s) for name, s in sorted(self._series.items())])


def _family(name: str, s: _Series) -> Metric:
    if s.kind in (BUFFERED_METRIC_KIND_COUNTER, BUFFERED_METRIC_KIND_GAUGE):
        names = _label_names(s.values)
        kind = CounterMetricFamily if s.kind == BUFFERED_METRIC_KIND_COUNTER else GaugeMetricFamily
        family = kind(name, s.help, labels=names)
        for labels, value in s.values.items():
            family.add_metric(_padded(labels, names), value)
        return family
    name = f"{name}_seconds" if s.seconds and not name.endswith("_seconds") else name
    names = _label_names(s.buckets)
    hist = HistogramMetricFamily(name, s.help, labels=names)
    for labels, counts in s.buckets.items():
        cumulative, running = [], 0.0
        for bound, count in zip([*map(str, s.bounds), "+Inf"], counts, strict=True):
            running += count
            cumulative.append((bound, running))
        hist.add_metric(_padded(labels, names), cumulative, s.sums[labels])
    return hist


def _label_names(series: dict[Labels, Any]) -> list[str]:
    """The label names of a family's series. Core gives one metric different attribute sets
    (a poll's counter with and without a poller type), so each series is padded to them all
    with empty values (which Prometheus reads as absent)."""
    return sorted({k for labels in series for k, _ in labels})


def _padded(labels: Labels, names: list[str]) -> list[str]:
    given = dict(labels)
    return [given.get(n, "") for n in names]
