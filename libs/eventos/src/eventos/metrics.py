"""Prometheus metrics shared by the services. Labels never carry employee, thread or content."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import Counter, Gauge, Histogram

INGRESS_APPEND_SECONDS = Histogram(
    "eventos_ingress_append_seconds",
    "Time from request start to committed append, by source kind and outcome.",
    ["source_kind", "outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
INGRESS_ANSWERS = Counter(
    "eventos_ingress_answers_total", "HTTP answers of /hooks by status code.", ["code"]
)
PUBLISH_ACKS = Counter("eventos_publish_acks_total", "gRPC Publish acks by status.", ["status"])
PUBLISH_STREAMS = Gauge("eventos_publish_streams", "Open gRPC Publish streams.")
PUBLISH_READ_AHEAD_BYTES = Gauge(
    "eventos_publish_read_ahead_bytes",
    "Bytes of Publish events read and not yet acknowledged, over all streams.",
)
PUBLISH_READ_AHEAD_EVENTS = Gauge(
    "eventos_publish_read_ahead_events",
    "Publish events read and not yet acknowledged, over all streams.",
)
ROUTER_ROWS = Counter(
    "eventos_router_rows_total", "Ingress rows settled by the router.", ["outcome"]
)
ROUTER_DELIVERIES = Counter("eventos_router_deliveries_total", "Deliveries written by the router.")
DEAD_LETTERS = Counter("eventos_dead_letters_total", "Dead letters by reason.", ["reason"])
KICKS_SENT = Counter("eventos_kicks_sent_total", "Wake kicks sent, by result.", ["result"])
EVENT_LOOP_LAG = Gauge("eventos_event_loop_lag_seconds", "Lateness of a 0.5 s asyncio timer.")


async def watch_event_loop_lag(interval: float = 0.5) -> None:
    """Measure how late the event loop runs a timer, forever."""
    while True:
        start = time.monotonic()
        await asyncio.sleep(interval)
        EVENT_LOOP_LAG.set(max(0.0, time.monotonic() - start - interval))
