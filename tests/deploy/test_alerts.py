"""The chart's monitoring: alert rules that `promtool check rules` accepts and whose unit tests
(tests/deploy/alerts_test.yaml) `promtool test rules` passes, a Grafana dashboard, and the
optional ServiceMonitor, PrometheusRule and dashboard ConfigMap (off by default). Every metric
the rules and the dashboard read is in docs/operations.md's Metrics table.

promtool comes from `EVENTOS_PROMTOOL` or `.tools/bin/promtool` (which `make tools` builds from
the Prometheus Go module); without it the tests fail loudly instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import charts
import pytest
import yaml
from charts import INSTANCE_CHART, ROOT, named, of_kind
from metrics_table import all_documented, used_in

RULES = INSTANCE_CHART / "files/alerts.yaml"
DASHBOARD = INSTANCE_CHART / "files/dashboard.json"
RULE_TESTS = Path(__file__).parent / "alerts_test.yaml"
MONITORING = (
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
)
P = f"{charts.RELEASE}-eventos"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    path = os.environ.get("EVENTOS_PROMTOOL") or str(ROOT / ".tools/bin/promtool")
    if not Path(path).is_file():
        raise AssertionError(f"promtool not found at {path}: run `make tools`")
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=120, check=False)


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def dashboard_exprs(doc: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def test_the_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in done.stdout, done.stdout


def test_the_alert_unit_tests_pass() -> None:
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout


def test_the_alert_unit_tests_can_fail(tmp_path: Path) -> None:
    """A threshold moved in a scratch copy of the rules fails the unit tests."""
    rules = RULES.read_text().replace("> 120", "> 100000")
    assert rules != RULES.read_text()
    (tmp_path / "alerts.yaml").write_text(rules)
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = ["alerts.yaml"]
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests))
    done = promtool("test", "rules", str(tmp_path / "alerts_test.yaml"))
    assert done.returncode != 0, done.stdout
    assert "EventosOwnerInputWaiting" in done.stdout + done.stderr


def test_every_alert_is_unit_tested() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"]}
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        t["alertname"] for case in tests for t in case["alert_rule_test"] if t.get("exp_alerts")
    }
    assert alerts == fired, f"alerts no unit test sees firing: {alerts - fired}"


def test_every_metric_the_rules_and_the_dashboard_read_is_documented() -> None:
    known = all_documented()
    dashboard = json.loads(DASHBOARD.read_text())
    for where, exprs in (("rules", rule_exprs()), ("dashboard", dashboard_exprs(dashboard))):
        used = set().union(*(used_in(e) for e in exprs))
        assert used, where
        assert not used - known, f"the {where} read metrics the Metrics table lacks: {used - known}"


def test_the_documented_check_can_fail() -> None:
    assert used_in("rate(eventos_relay_lag_seconds_bucket[5m])") == {"eventos_relay_lag_seconds"}
    assert used_in("eventos_no_such_thing_total > 0") - all_documented() == {
        "eventos_no_such_thing_total"
    }


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in doc["panels"]:
        assert panel["targets"], panel["title"]
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert all('namespace=~"$namespace"' in t["expr"] for t in panel["targets"]), panel


def test_monitoring_is_off_by_default() -> None:
    for tier in ("S", "L"):
        docs = charts.instance(tier)
        assert not of_kind(docs, "ServiceMonitor") and not of_kind(docs, "PrometheusRule")
        assert not [
            d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
        ]


@pytest.mark.parametrize("tier", ["S", "L"])
def test_the_service_monitor_scrapes_every_service(tier: str) -> None:
    docs = charts.instance(tier, *MONITORING, "monitoring.serviceMonitor.labels.release=kps")
    monitor = named(docs, "ServiceMonitor", P)
    # Structural check of the CRD kind the Kubernetes schemas do not know.
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert monitor["metadata"]["labels"]["release"] == "kps"
    spec = monitor["spec"]
    assert set(spec) == {"namespaceSelector", "selector", "endpoints"}
    assert spec["namespaceSelector"] == {"matchNames": [charts.NAMESPACE]}
    (endpoint,) = spec["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s",
                        "scrapeTimeout": "10s"}  # fmt: skip
    selector = spec["selector"]["matchLabels"]
    services = [
        s for s in of_kind(docs, "Service")
        if selector.items() <= s["metadata"]["labels"].items()
    ]  # fmt: skip
    scraped = {s["metadata"]["name"] for s in services
               if any(p["name"] == "metrics" for p in s["spec"]["ports"])}  # fmt: skip
    roles = {f"{P}-{r}" for r in ("ingress", "router", "relay", "workers-workflow", "egress")}
    assert roles <= scraped, roles - scraped
    assert any(name.startswith(f"{P}-llm") for name in scraped), scraped


def test_the_prometheus_rule_carries_the_rules_file(tmp_path: Path) -> None:
    docs = charts.instance("L", *MONITORING)
    rule = named(docs, "PrometheusRule", P)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(rule["spec"]) == {"groups"}
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = promtool("check", "rules", str(rendered))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_config_map_carries_the_dashboard() -> None:
    docs = charts.instance("S", *MONITORING)
    config = named(docs, "ConfigMap", f"{P}-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config["data"]["eventos.json"]) == json.loads(DASHBOARD.read_text())
