"""Every family of a prometheus_client registry as OTel metric data, with no per-metric code.

The services define their metrics once, with prometheus_client (eventos.runtime.metrics) and serve
them on /metrics; this module reads the same registry at each export and converts what it collects:
counters to cumulative monotonic sums, gauges and info to gauges, histograms to explicit-bucket
histograms with their own bounds, summaries to their count and sum. OTel observable instruments
cannot carry a histogram (the API has no observable histogram), and registering instruments
metric by metric is the per-metric code this avoids; reading the registry also picks up a family
registered after boot. Labels pass the allowlist (eventos.telemetry.allowlist): a label off it is
dropped and the points that then share attributes are added together.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric as PromMetric

from eventos.telemetry.allowlist import datapoint_attributes

SCOPE = InstrumentationScope("eventos")
NS = 1_000_000_000
CUMULATIVE = AggregationTemporality.CUMULATIVE
Attrs = tuple[tuple[str, str], ...]


def _attrs(labels: dict[str, str]) -> Attrs:
    return tuple(sorted(datapoint_attributes(labels).items()))


@dataclass
class _Buckets:
    """One histogram series: cumulative bucket counts by upper bound, sum, start."""

    counts: dict[float, float] = field(default_factory=lambda: defaultdict(float))
    total: float = 0.0
    start_ns: int = 0


@dataclass
class RegistryBridge:
    """Converts one registry's families at each call of `collect`."""

    registry: CollectorRegistry
    resource: Resource
    start_ns: int = field(default_factory=time.time_ns)

    def collect(self) -> MetricsData:
        """What the registry holds now, as one OTLP metrics batch."""
        now = time.time_ns()
        metrics = [m for fam in self.registry.collect() for m in self.convert(fam, now)]
        scope = ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")
        return MetricsData([ResourceMetrics(self.resource, [scope], schema_url="")])

    def convert(self, family: PromMetric, now: int) -> list[Metric]:
        kind = family.type
        if kind == "counter":
            return [self._sum(family.name, family, now, "_total")]
        if kind == "histogram":
            return [self._histogram(family, now)]
        if kind == "summary":
            return [self._sum(family.name + "_count", family, now, "_count"),
                    self._sum(family.name + "_sum", family, now, "_sum")]  # fmt: skip
        return [self._gauge(family, now)]

    def _start(self, family: PromMetric, labels: dict[str, str]) -> int:
        for s in family.samples:
            if s.name == family.name + "_created" and s.labels == labels:
                return int(s.value * NS)
        return self.start_ns

    def _sum(self, name: str, family: PromMetric, now: int, suffix: str) -> Metric:
        values: dict[Attrs, float] = defaultdict(float)
        starts: dict[Attrs, int] = {}
        for s in family.samples:
            if s.name == family.name + suffix:
                key = _attrs(s.labels)
                values[key] += s.value
                starts.setdefault(key, self._start(family, s.labels))
        points = [NumberDataPoint(dict(k), starts[k], now, v) for k, v in values.items()]
        data = Sum(points, CUMULATIVE, is_monotonic=True)
        return Metric(name, family.documentation, family.unit, data)

    def _gauge(self, family: PromMetric, now: int) -> Metric:
        values: dict[Attrs, float] = defaultdict(float)
        for s in family.samples:
            if not s.name.endswith("_created"):
                values[_attrs(s.labels)] += s.value
        points = [NumberDataPoint(dict(k), self.start_ns, now, v) for k, v in values.items()]
        name = family.name + "_info" if family.type == "info" else family.name  # as /metrics has it
        return Metric(name, family.documentation, family.unit, Gauge(points))

    def _histogram(self, family: PromMetric, now: int) -> Metric:
        series: dict[Attrs, _Buckets] = defaultdict(_Buckets)
        for s in family.samples:
            if s.name == family.name + "_bucket":
                labels = {k: v for k, v in s.labels.items() if k != "le"}
                one = series[_attrs(labels)]
                one.counts[float(s.labels["le"])] += s.value
                one.start_ns = one.start_ns or self._start(family, labels)
            elif s.name == family.name + "_sum":
                series[_attrs(s.labels)].total += s.value
        points = [_histogram_point(dict(k), b, now) for k, b in series.items()]
        return Metric(family.name, family.documentation, family.unit, Histogram(points, CUMULATIVE))


def _histogram_point(attrs: dict[str, str], b: _Buckets, now: int) -> HistogramDataPoint:
    bounds = sorted(le for le in b.counts if not math.isinf(le))
    cumulative = [b.counts[le] for le in bounds] + [b.counts.get(math.inf, 0.0)]
    per_bucket = [int(c - p) for c, p in zip(cumulative, [0.0, *cumulative[:-1]], strict=True)]
    count = int(cumulative[-1])
    # Prometheus keeps no min or max: None leaves OTLP's optional fields unset.
    unset: Any = None
    return HistogramDataPoint(attrs, b.start_ns, now, count, b.total, per_bucket, bounds,
                              min=unset, max=unset)  # fmt: skip
