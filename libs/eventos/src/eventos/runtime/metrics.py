"""Prometheus metrics of the services (SPEC §12). Labels never carry employee, thread, workflow
ids or content: only classes, outcomes, statuses, kinds and fixed reason words.

Every family is a plain prometheus_client object created outside any registry; a service
registers the families it updates (`SERVED`, plus `COMMON`) into the default registry when it
starts (`register`), so each /metrics, and whatever reads the default registry, shows that
service's families only. docs/operations.md lists them per service, and
tests/e2e/test_metrics_served.py holds the list against each service's /metrics.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Final

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from eventos import names
from eventos.runtime import build

LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
                          300, 600, 1800, 3600)  # fmt: skip
WAIT_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# An activity attempt past this number counts as a retry over the threshold (SPEC §12).
RETRY_THRESHOLD: Final = 3


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    return Counter(name, doc, labels, registry=None)


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
    return Gauge(name, doc, labels, registry=None)


def _histogram(
    name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]
) -> Histogram:
    return Histogram(name, doc, labels, buckets=buckets, registry=None)


# --- every service
EVENT_LOOP_LAG = _gauge("eventos_event_loop_lag_seconds", "Lateness of a 0.5 s asyncio timer.")
BUILD_INFO = _gauge(
    "eventos_build_info",
    "Always 1: the service, the eventos release, the source's build id, the images' tag, the "
    "chart's version, the Temporal server's version and the migration level it runs.",
    ("service", "version", "build", "image_tag", "chart", "temporal_server", "migrations"),
)  # fmt: skip

# --- ingress
INGRESS_APPEND_SECONDS = _histogram(
    "eventos_ingress_append_seconds",
    "Time from request start to committed append, by source kind and outcome.",
    ("source_kind", "outcome"),
    (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
INGRESS_ANSWERS = _counter(
    "eventos_ingress_answers_total", "HTTP answers of /hooks by status code.", ("code",)
)
WEBHOOK_PREVIOUS_SECRET = _counter(
    "eventos_webhook_previous_secret_total",
    "Webhook requests verified by a rotated secret's previous value, within its overlap window.",
)
PUBLISH_ACKS = _counter("eventos_publish_acks_total", "gRPC Publish acks by status.", ("status",))
PUBLISH_STREAMS = _gauge("eventos_publish_streams", "Open gRPC Publish streams.")
PUBLISH_READ_AHEAD_BYTES = _gauge(
    "eventos_publish_read_ahead_bytes",
    "Bytes of Publish events read and not yet acknowledged, over all streams.",
)
PUBLISH_READ_AHEAD_EVENTS = _gauge(
    "eventos_publish_read_ahead_events",
    "Publish events read and not yet acknowledged, over all streams.",
)

# --- router
ROUTER_ROWS = _counter(
    "eventos_router_rows_total", "Ingress rows settled by the router.", ("outcome",)
)
ROUTER_DELIVERIES = _counter("eventos_router_deliveries_total", "Deliveries written by the router.")

# --- several
DEAD_LETTERS = _counter(
    "eventos_dead_letters_total",
    "Ingress rows and deliveries settled dead, by reason.",
    ("reason",),
)
KICKS_SENT = _counter("eventos_kicks_sent_total", "Wake kicks sent, by result.", ("result",))
ACTIVITY_RETRIES = _counter(
    "eventos_activity_retries_total",
    f"Activity attempts past attempt {RETRY_THRESHOLD}, by activity type.",
    ("activity_type",),
)

# --- relay
RELAY_LAG = _histogram(
    "eventos_relay_lag_seconds",
    "From a delivery's write by the router to Temporal accepting its batch, by class.",
    ("llm_class",), LATENCY_BUCKETS,
)  # fmt: skip
PENDING_OLDEST_AGE = _gauge(
    "eventos_pending_oldest_age_seconds",
    "Age of the oldest open (pending or held) delivery, by class (0 when none).",
    ("llm_class",),
)
PENDING_HELD = _gauge(
    "eventos_pending_held", "Open deliveries on held streams, by class and hold reason.",
    ("llm_class", "hold"),
)  # fmt: skip
BREAKERS_OPEN = _gauge(
    "eventos_breakers_open",
    "Open breakers: `temporal` (this relay's), `employee_edge` (wakes between employees).",
    ("breaker",),
)
SLOW_TURNS = _counter(
    "eventos_slow_turns_total",
    "Turns that passed their class's slow-turn threshold.",
    ("llm_class",),
)
BACKSTOPS = _counter(
    "eventos_turn_backstops_total",
    "Turns with no completed step for 24 hours, by what the backstop did.",
    ("action",),
)
ALARMS_SWEPT = _counter(
    "eventos_alarms_swept_total",
    "Overdue alarms the relay's upkeep sweep fired or missed because their supervisor did not "
    "(a lost alarms_changed hint, a supervisor down), by outcome.",
    ("outcome",),
)
WATCHDOG_ALERTS = _counter(
    "eventos_watchdog_alerts_total",
    "Attention items the supervision watchdogs raised (router_stalled, window_stalled, "
    "stuck_retry, stuck_turn, workflow_task_failing), by kind.",
    ("kind",),
)
THREADS_QUARANTINED = _gauge("eventos_threads_quarantined", "Threads quarantined now.")
EMPLOYEES_DEGRADED = _gauge("eventos_employees_degraded", "Employees degraded now.")
DEGRADED_TRANSITIONS = _counter(
    "eventos_employee_degraded_transitions_total",
    "Employees that became degraded, or recovered when their window did, by the state entered.",
    ("state",),
)

# --- workers-workflow
TURN_DURATION = _histogram(
    "eventos_turn_duration_seconds", "Turns from start to end, by class and outcome.",
    ("llm_class", "outcome"), LATENCY_BUCKETS,
)  # fmt: skip
RUN_SIGNALS = _histogram(
    "eventos_entity_run_signals", "Signals one entity run received, at its end (rolled or closed).",
    ("end",), (1, 4, 16, 64, 256, 1024, 4096, 16384),
)  # fmt: skip
RUN_HISTORY_BYTES = _histogram(
    "eventos_entity_run_history_bytes", "Event history size of one entity run, at its end.",
    ("end",), (16384, 65536, 262144, 1048576, 4194304, 16777216, 52428800),
)  # fmt: skip
ADMISSION_WAIT = _histogram(
    "eventos_admission_wait_seconds",
    "From an entity's first ask for a turn slot to the grant, by class.",
    ("llm_class",), (*WAIT_BUCKETS, 600, 1800),
)  # fmt: skip
PARKED_TURNS = _counter(
    "eventos_turns_parked_total", "Turns parked (no slot held) by reason.", ("reason",)
)
TURN_FAILURES = _counter(
    "eventos_turn_failures_total",
    "Failed turns by their cause's category (eventos.failures; never its message).",
    ("reason",),
)
TOOL_CALLS = _counter(
    "eventos_tool_calls_total", "Tool call attempts that ended, by tool and outcome.",
    ("tool", "outcome"),
)  # fmt: skip
THREAD_HOLDS = _counter(
    "eventos_thread_holds_total",
    "Threads held for their failing turns, by hold (backoff, quarantined).",
    ("hold",),
)
BUDGET_TRANSITIONS = _counter(
    "eventos_budget_transitions_total", "Budget state changes of employees, by the state entered.",
    ("state",),
)  # fmt: skip

# --- workers-llm (buckets recommended by the OTel GenAI semantic conventions)
TOKEN_USAGE = _histogram(
    "gen_ai_client_token_usage",
    "Tokens per LLM step (gen_ai.client.token.usage), input or output.",
    ("gen_ai_token_type", "gen_ai_provider_name", "llm_class"),
    (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304),
)
OPERATION_DURATION = _histogram(
    "gen_ai_client_operation_duration_seconds",
    "Duration of one LLM step attempt (gen_ai.client.operation.duration), by outcome.",
    ("gen_ai_provider_name", "llm_class", "outcome"),
    (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
     163.84, 327.68),
)  # fmt: skip
SLOT_WAIT = _histogram(
    "eventos_llm_slot_wait_seconds",
    "From an LLM step attempt's scheduling to a worker slot taking it (schedule-to-start).",
    ("llm_class",), WAIT_BUCKETS,
)  # fmt: skip
RATE_WAITS = _counter(
    "eventos_llm_rate_waits_total",
    "LLM step attempts that waited for their credential's bucket or pause, by class.",
    ("llm_class",),
)

# --- egress
EGRESS_DEPTH = _gauge(
    "eventos_egress_depth", "Outbox rows not settled yet, by status (queued, held, sending).",
    ("status",),
)  # fmt: skip
CHANNEL_BACKPRESSURE = _counter(
    "eventos_channel_backpressure_total",
    "Channel accounts past their backlog bound: reads paused and webhooks answered 429.",
    ("driver", "action"),
)  # fmt: skip
EGRESS_LATENCY = _histogram(
    "eventos_egress_latency_seconds", "From an outbox row's write to its send, by channel kind.",
    ("kind",), LATENCY_BUCKETS,
)  # fmt: skip

COMMON: Final[tuple[MetricWrapperBase, ...]] = (EVENT_LOOP_LAG, BUILD_INFO)
SERVED: Final[dict[str, tuple[MetricWrapperBase, ...]]] = {
    "ingress": (INGRESS_APPEND_SECONDS, INGRESS_ANSWERS, PUBLISH_ACKS, PUBLISH_STREAMS,
                PUBLISH_READ_AHEAD_BYTES, PUBLISH_READ_AHEAD_EVENTS, DEAD_LETTERS, KICKS_SENT,
                CHANNEL_BACKPRESSURE, WEBHOOK_PREVIOUS_SECRET),
    "router": (ROUTER_ROWS, ROUTER_DELIVERIES, DEAD_LETTERS, KICKS_SENT),
    "relay": (RELAY_LAG, PENDING_OLDEST_AGE, PENDING_HELD, BREAKERS_OPEN, DEAD_LETTERS,
              SLOW_TURNS, BACKSTOPS, WATCHDOG_ALERTS, THREADS_QUARANTINED, EMPLOYEES_DEGRADED,
              DEGRADED_TRANSITIONS, ALARMS_SWEPT,
              TURN_DURATION, EGRESS_LATENCY),  # turns lost and sends orphaned, at a re-arm
    "workers-workflow": (TURN_DURATION, RUN_SIGNALS, RUN_HISTORY_BYTES, ADMISSION_WAIT,
                         PARKED_TURNS, TURN_FAILURES, TOOL_CALLS, BUDGET_TRANSITIONS, DEAD_LETTERS,
                         ACTIVITY_RETRIES, THREAD_HOLDS),
    "workers-llm": (TOKEN_USAGE, OPERATION_DURATION, SLOT_WAIT, RATE_WAITS, BUDGET_TRANSITIONS,
                    ACTIVITY_RETRIES),
    "egress": (EGRESS_DEPTH, EGRESS_LATENCY, ACTIVITY_RETRIES),
}  # fmt: skip
_registered: set[int] = set()

# Dead-letter reasons as labels: the word a stored reason starts with, when it is one of ours.
DEAD_REASONS: Final = frozenset({
    "reset", "rejected", "malformed", "filter_error", "placement_invalid", "turn_failed",
    "parked", names.LOOP_SUPPRESSED,
})  # fmt: skip
DEAD_RESET: Final = "reset"  # the inputs of a generation that no longer runs
_REASON_WORD = re.compile(r"[a-z_]+")


_build_labels: dict[str, tuple[str, ...]] = {}  # each service's eventos_build_info labels


def register(service: str) -> None:
    """Put the service's families (and the common ones) in the default registry, once each;
    `eventos_build_info` names the service."""
    for family in (*COMMON, *SERVED.get(service, ())):
        if id(family) not in _registered:
            REGISTRY.register(family)
            _registered.add(id(family))
    r = build.running_release()
    labels = (service, r.version, r.build, r.image_tag, r.chart, r.temporal_server,
              str(r.migrations))  # fmt: skip
    before = _build_labels.get(service)
    if before is not None and before != labels:  # one series a service, the release it runs now
        BUILD_INFO.remove(*before)
    BUILD_INFO.labels(*labels).set(1)
    _build_labels[service] = labels


def dead_reason(reason: str | None) -> str:
    """The label of a dead letter's stored reason: its first word if it is a known one."""
    found = _REASON_WORD.match(reason or "")
    word = found.group(0) if found else ""
    return word if word in DEAD_REASONS else "other"


def count_dead(reason: str | None, n: int = 1) -> None:
    """Count `n` dead letters written with this reason (after their transaction committed)."""
    if n > 0:
        DEAD_LETTERS.labels(dead_reason(reason)).inc(n)


def class_label(klass: int) -> str:
    """A class as its label value: `c1` … `c4`."""
    return f"c{klass}"


async def watch_event_loop_lag(interval: float = 0.5) -> None:
    """Measure how late the event loop runs a timer, forever."""
    while True:
        start = time.monotonic()
        await asyncio.sleep(interval)
        EVENT_LOOP_LAG.set(max(0.0, time.monotonic() - start - interval))
