"""EG15: the telemetry export carries no message text, prompts, customer data or credentials.

The six services run as processes, exporting to the real collector (`make tools` builds it)
with the collector chart's rendered configuration. A scripted run's chats, prompt, customer
identifiers, webhook bodies and credentials carry canary strings; so do a hostile resource
attribute and the exporter's own credential. Then what each service sent (`raw`, captured in
the collector before any processor) and what left the collector (`out`) are read: no canary in
either, every attribute key on the allowlist, every value of its declared type. The services'
JSON logs at INFO carry no canary either (SPEC §13, issue 15 point 8).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from collector import Collector, batches
from conftest import E2E_TIMEOUT_S, SECRETS
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from signing import stripe
from stack import ORDER, OUTBOX_KEYS, Owner, Stack, base_env, one, until

from eventos.settings import TemporalSettings
from eventos.telemetry.allowlist import DATAPOINT_KEYS, LOG_KEYS, RESOURCE_KEYS, violations
from eventos.telemetry.errors import ErrorCounter
from eventos.telemetry.exporter import Exporter
from eventos.telemetry.settings import TelemetrySettings
from eventos.telemetry.temporal_metrics import TemporalMetrics
from eventos.testing import wait_for_sync
from eventos.testing.plugin import PostgresForTests

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

NAME = "canaryemp-r8"  # in every workflow id: never in telemetry (logs may name it)
CHAT = "canary-chat-Zq81"
FAILING_CHAT = "canary-retry-Hn40"
PROMPT = "canary-prompt-Wk27"
CUSTOMER = "cus_canarycust9T"
BODY = "canary-body-Pm53"
WEBHOOK_SECRET = "whsec_canarycred5R"
OTLP_TOKEN = "canary-otlp-token-Lb66"
EMPLOYEE_TAG = "canary-employee-Ys12"
# Content and credentials: in neither telemetry nor logs at INFO.
CONTENT = (CHAT, FAILING_CHAT, PROMPT, CUSTOMER, BODY, WEBHOOK_SECRET, OTLP_TOKEN,
           OUTBOX_KEYS.split(":")[-1])  # fmt: skip
# Telemetry carries no employee, thread or workflow id either.
CANARIES = (*CONTENT, NAME, EMPLOYEE_TAG)
SERVICES = {f"eventos-{name}" for name in ORDER}

SPEC = f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {NAME}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}, system: "{PROMPT} You help."}}]
  triggers:
    - {{kind: chat}}
    - {{kind: webhook, path: stripe, verify: {{scheme: stripe, secret: stripe-whsec}},
       thread_by: data.body.customer}}
"""


@dataclass
class Run:
    """What a scripted run left: the collector's two files, logs and /metrics per service."""

    raw: list[dict[str, Any]]
    out: list[dict[str, Any]]
    raw_text: str
    out_text: str
    logs: dict[str, str]
    served: dict[str, str]


@pytest.fixture(scope="module")
def database(postgres_server: PostgresForTests, template_database: str) -> Iterator[str]:
    """A database of this module's own (one stack serves every test here)."""
    name = f"t_{os.getpid()}_eg15"
    ident, template = sql.Identifier(name), sql.Identifier(template_database)
    postgres_server.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(ident, template))
    yield postgres_server.url(name)
    postgres_server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    running = Collector(tmp_path_factory.mktemp("collector"))
    running.start()
    try:
        yield running
    finally:
        running.stop()


def telemetry_env(collector: Collector) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {OTLP_TOKEN}",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        # What the chart sets, plus a tag no instance may send.
        "OTEL_RESOURCE_ATTRIBUTES": "service.namespace=eventos,service.version=0.1.0,"
        f"eventos.instance.id=inst-eg15,eventos.tier=S,employee.name={EMPLOYEE_TAG}",
        "EVENTOS_LOG_FORMAT": "json",
        "EVENTOS_LOG_LEVEL": "INFO",
    }


def services_in(found: list[dict[str, Any]], signal: str) -> set[str]:
    key = "resourceMetrics" if signal == "metrics" else "resourceLogs"
    return {resource_attrs(r).get("service.name", "") for b in found for r in b.get(key, [])}


def resource_attrs(resource: dict[str, Any]) -> dict[str, Any]:
    return attrs(resource.get("resource", {}).get("attributes", []))


def metric_names(found: list[dict[str, Any]], service: str) -> set[str]:
    return {
        m["name"]
        for b in found
        for r in b.get("resourceMetrics", [])
        if resource_attrs(r).get("service.name") == service
        for s in r.get("scopeMetrics", [])
        for m in s.get("metrics", [])
    }


def exported_everything(c: Collector) -> bool:
    """Every service's metrics, the LLM worker's error report and the Temporal runtime's
    figures reached both files."""
    for found in (batches(c.raw), batches(c.out)):
        if not services_in(found, "metrics") >= SERVICES:
            return False
        if "eventos-workers-llm" not in services_in(found, "logs"):
            return False
        if "temporal_activity_schedule_to_start_latency_seconds" not in metric_names(
            found, "eventos-workers-llm"
        ):
            return False
    return True


@pytest.fixture(scope="module")
def run(
    database: str,
    temporal_settings: TemporalSettings,
    collector: Collector,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Run]:
    logs = tmp_path_factory.mktemp("logs")
    env = base_env(database, temporal_settings.address, temporal_settings.namespace, logs / "b")
    env.update(SECRETS)
    env["EVENTOS_SECRET_STRIPE_WHSEC"] = WEBHOOK_SECRET
    env.update(telemetry_env(collector))
    with Stack(env, logs) as stack:
        owner = Owner(stack.ingress_url)
        owner.apply_and_start(SPEC, NAME)
        chats = [
            owner.chat(NAME, f"hello {CHAT}"),
            owner.chat(NAME, f"fail: 500 1\n{FAILING_CHAT}"),
        ]
        body = json.dumps({"id": f"evt_{uuid.uuid4().hex[:12]}", "type": "invoice.paid",
                           "customer": CUSTOMER, "note": BODY}).encode()  # fmt: skip
        hook = httpx.post(f"{stack.ingress_url}/hooks/stripe", content=body,
                          headers=stripe(body, secret=WEBHOOK_SECRET), timeout=10)  # fmt: skip
        assert hook.status_code == 200, hook.text
        until(lambda: all(owner.message(NAME, m)["reply"] for m in chats), 120, "replies", stack)
        # The webhook consumed too (owner messages may share a turn; the webhook has its own).
        until(lambda: one(database, "SELECT bool_and(status = 'done') FROM bus_deliveries")
              and one(database, "SELECT count(*) FROM turns WHERE status = 'running'") == 0,
              120, "every delivery consumed", stack)  # fmt: skip
        until(lambda: exported_everything(collector), 120, "exports in both files", stack)
        served = {n: httpx.get(f"{stack[n].url}/metrics", timeout=10).text for n in ORDER}
        # A family can first appear between two exports: give the next export its turn.
        with contextlib.suppress(AssertionError):
            wait_for_sync(lambda: not unexported(served, batches(collector.raw)), timeout=30)
    yield Run(
        raw=batches(collector.raw),
        out=batches(collector.out),
        raw_text=collector.raw.read_text(),
        out_text=collector.out.read_text(),
        logs={n: (logs / f"{n}.log").read_text(errors="replace") for n in ORDER},
        served=served,
    )


def value(v: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as Python (ints are strings in OTLP/JSON)."""
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    return v  # an array or a map: never a declared type


def attrs(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: value(a.get("value", {})) for a in items}


def every_attribute_set(batch: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(level, attributes) of every resource, scope, data point and log record of a request."""
    for rm in batch.get("resourceMetrics", []):
        yield "resource", resource_attrs(rm)
        for sm in rm.get("scopeMetrics", []):
            yield "scope", attrs(sm.get("scope", {}).get("attributes", []))
            for metric in sm.get("metrics", []):
                for kind in ("sum", "gauge", "histogram", "exponentialHistogram", "summary"):
                    for point in metric.get(kind, {}).get("dataPoints", []):
                        yield "datapoint", attrs(point.get("attributes", []))
    for rl in batch.get("resourceLogs", []):
        yield "resource", resource_attrs(rl)
        for sl in rl.get("scopeLogs", []):
            yield "scope", attrs(sl.get("scope", {}).get("attributes", []))
            for record in sl.get("logRecords", []):
                yield "log", attrs(record.get("attributes", []))


ALLOWED: dict[str, dict[str, type]] = {"resource": RESOURCE_KEYS, "scope": {},
                                       "datapoint": DATAPOINT_KEYS, "log": LOG_KEYS}  # fmt: skip


@pytest.mark.parametrize("side", ["raw", "out"])
def test_no_canary_leaves_a_service_or_the_collector(run: Run, side: str) -> None:
    text = run.raw_text if side == "raw" else run.out_text
    assert text, f"nothing in {side}"
    leaked = [c for c in CANARIES if c in text]
    assert not leaked, f"{side} carries {leaked}"


@pytest.mark.parametrize("side", ["raw", "out"])
def test_every_attribute_is_allowlisted_and_of_its_declared_type(run: Run, side: str) -> None:
    found = run.raw if side == "raw" else run.out
    problems = {
        f"{level}: {problem}"
        for batch in found
        for level, attributes in every_attribute_set(batch)
        for problem in violations(attributes, ALLOWED[level])
    }
    assert not problems, f"{side}: {sorted(problems)}"


def test_error_reports_carry_type_frames_and_count_with_an_empty_body(run: Run) -> None:
    records = [(attrs(r.get("attributes", [])), r.get("body", {}))
               for b in run.out for rl in b.get("resourceLogs", [])
               for sl in rl.get("scopeLogs", []) for r in sl.get("logRecords", [])]  # fmt: skip
    assert records
    for attributes, body in records:
        assert attributes["exception.type"] and attributes["error.count"] >= 1
        assert " in " in attributes["exception.stacktrace"]
        assert body in ({}, {"stringValue": ""})
    resources = [resource_attrs(rl) for b in run.out for rl in b.get("resourceLogs", [])]
    assert all(r["eventos.instance.id"] == "inst-eg15" and r["eventos.tier"] == "S"
               and r["service.version"] == "0.1.0" for r in resources)  # fmt: skip


def served_families(text: str) -> set[str]:
    """The names /metrics families take in OTLP (an info family ends in `_info`). A `_created`
    line is a counter's start time (the text parser reads some as a family of their own)."""
    names = set()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):
            continue
        if family.type == "summary":
            names |= {family.name + "_count", family.name + "_sum"}
        else:
            names.add(family.name + "_info" if family.type == "info" else family.name)
    return names


def unexported(served: dict[str, str], raw: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per service, the families its /metrics serves that no export of it carried."""
    missing = {
        n: served_families(text) - metric_names(raw, f"eventos-{n}") for n, text in served.items()
    }
    return {n: names for n, names in missing.items() if names}


def test_every_family_a_service_serves_is_exported(run: Run) -> None:
    assert not unexported(run.served, run.raw)


@pytest.mark.parametrize("service", ORDER)
def test_metrics_served_carry_no_canary(run: Run, service: str) -> None:
    assert not [c for c in CANARIES if c in run.served[service]]


@pytest.mark.parametrize(
    ("service", "figure"),
    [
        ("workers-workflow", "temporal_workflow_task_schedule_to_start_latency_seconds_count"),
        ("workers-workflow", "temporal_workflow_task_queue_poll_succeed_total"),
        ("workers-workflow", "temporal_sticky_cache_size"),
        ("workers-llm", "temporal_activity_schedule_to_start_latency_seconds_count"),
        ("workers-llm", "temporal_activity_execution_latency_seconds_count"),
        ("egress", "temporal_num_pollers"),
    ],
)
def test_the_temporal_runtime_figures_are_served_by_queue(
    run: Run, service: str, figure: str
) -> None:
    text = run.served[service]
    lines = [ln for ln in text.splitlines() if ln.startswith(figure)]
    assert lines, f"{service} serves no {figure}"
    if figure != "temporal_sticky_cache_size":  # the cache is the worker's, not a queue's
        assert any('queue="' in ln for ln in lines), lines
    assert "task_queue=" not in text and "namespace=" not in text


@pytest.mark.parametrize("service", ORDER)
def test_logs_at_info_are_json_without_canaries(run: Run, service: str) -> None:
    # The harness writes a `--- <time> starting <service>` line before each start.
    lines = [
        ln for ln in run.logs[service].splitlines() if ln.strip() and not ln.startswith("--- ")
    ]
    assert lines
    for line in lines:
        doc = json.loads(line)
        assert doc["level"] in ("INFO", "WARNING", "ERROR", "CRITICAL"), line
    leaked = [c for c in CONTENT if c in run.logs[service]]
    assert not leaked, f"{service} logged {leaked}"


def test_http_protobuf_export_reaches_the_collector(collector: Collector) -> None:
    """The other protocol the chart offers (`telemetry.otlpProtocol: http/protobuf`)."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.http_port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "eventos-http-probe",
        "OTEL_METRIC_EXPORT_INTERVAL": "3600000",
    }
    registry = CollectorRegistry()
    Counter("probe_events", "Probe.", ["outcome"], registry=registry).labels("ok").inc()
    errors = ErrorCounter()
    exporter = Exporter(
        TelemetrySettings.from_env("probe", env), registry, TemporalMetrics(), errors
    )
    exporter.start()
    try:
        boom = logging.LogRecord("probe", logging.ERROR, __file__, 1, "x", (),
                                 (KeyError, KeyError(CHAT), None))  # fmt: skip
        errors.handle(boom)
        exporter.export()
    finally:
        exporter.stop()
    wait_for_sync(lambda: "probe_events" in metric_names(batches(collector.out), "eventos-http-probe")
                  and "eventos-http-probe" in services_in(batches(collector.out), "logs"),
                  timeout=30, what="the HTTP export in the collector's output")  # fmt: skip
    assert CHAT not in collector.raw.read_text()  # the exception's message stayed home
