"""docs/operations.md's Metrics table, read the way the metric tests hold it, and a family's
sample as a test reads it (in-process services count into the same family objects)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from eventos import names

DOC = Path(__file__).parents[1] / "docs" / "operations.md"
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")  # a histogram family's series in PromQL
FAMILY = re.compile(r"\b((?:eventos|gen_ai)_[a-z0-9_]+)")
# What in PromQL names labels, not series: matchers and grouping or matching clauses.
LABEL_PARTS = re.compile(
    r"\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
)


def documented() -> dict[str, set[str]]:
    """{service: the families the Metrics table gives it} (`every service`: each of them)."""
    text = DOC.read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "docs/operations.md has no Metrics table"
    served: dict[str, set[str]] = {s: set() for s in names.SERVICES}
    for row in rows:
        metric_cell, services_cell = row.split(" | ")[:2]
        families = {m.split("{")[0] for m in re.findall(r"`([^`]+)`", metric_cell)}
        services = (
            list(names.SERVICES)
            if services_cell.strip() == "every service"
            else [s.strip() for s in services_cell.split(",")]
        )
        for service in services:
            assert service in served, f"unknown service {service!r} in the Metrics table"
            served[service] |= families
    return served


def all_documented() -> set[str]:
    return set().union(*documented().values())


def used_in(expr: str) -> set[str]:
    """The families a PromQL expression reads (a histogram's `_bucket` etc. as its family)."""
    found = set()
    for series in FAMILY.findall(LABEL_PARTS.sub(" ", expr)):
        family = series
        for suffix in HISTOGRAM_SERIES:
            if series.endswith(suffix) and series.removesuffix(suffix) in all_documented():
                family = series.removesuffix(suffix)
        found.add(family)
    return found


def sample(family: MetricWrapperBase, suffix: str = "_total", **labels: str) -> float:
    """The value of the family's `<name><suffix>` sample with exactly these labels (0 if none):
    `_total` of a counter, `_count` or `_sum` of a histogram, `""` of a gauge."""
    for metric in family.collect():
        for s in metric.samples:
            if s.name == metric.name + suffix and s.labels == labels:
                return float(s.value)
    return 0.0
