"""Both charts lint and render for both tiers, and every rendered manifest is valid against the
Kubernetes 1.30 schemas (strict: unknown fields refused), offline with kubernetes-validate.
CRDs are not in those schemas: only the kinds in CRD_KINDS are left to the structural tests."""

from __future__ import annotations

import charts
import pytest
from charts import COLLECTOR_CHART, INSTANCE_CHART, TIER_FILES
from kubernetes_validate import utils as kv

KUBERNETES = ("1.30.0", "1.33.0")
# KEDA, checked in test_chart_instance.py; the Prometheus Operator's, in test_alerts.py
CRD_KINDS = {"ScaledObject", "ServiceMonitor", "PrometheusRule"}

RENDERS = {
    "tier S": lambda: charts.instance("S"),
    "tier S, bundled PostgreSQL, Ingress, every Secret": lambda: charts.instance(
        "S",
        "postgresql.bundled.enabled=true",
        "postgresql.existingSecret=acme-postgresql",
        "ingress.enabled=true",
        "ingress.host=acme.example.com",
        "ingress.tlsSecretName=acme-tls",
        "secrets.internal.existingSecret=acme-internal",
        "secrets.outbox.existingSecret=acme-outbox",
        "secrets.employees.existingSecret=acme-employees",
        "ingress.grpc.tls.secretName=acme-grpc-tls",
        "llm.endpoints.openai.base_url=https://api.openai.com/v1",
        "llm.endpoints.openai.credentials={openai-main}",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
        "ingress.networkPolicy.grpcFrom[0].ipBlock.cidr=10.20.0.0/16",
    ),
    "tier L, every Secret, gRPC TLS": lambda: charts.instance(
        "L",
        "secrets.internal.existingSecret=acme-internal",
        "secrets.outbox.existingSecret=acme-outbox",
        "ingress.grpc.tls.secretName=acme-grpc-tls",
        "ingress.enabled=true",
        "ingress.host=acme.example.com",
    ),
    "tier L, HPA": lambda: charts.instance("L"),
    "tier L, monitoring": lambda: charts.instance(
        "L",
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.dashboard.enabled=true",
    ),
    "tier L, KEDA": lambda: charts.instance("L", "autoscaling.keda.enabled=true"),
    "tier L, bundled PostgreSQL": lambda: charts.render(
        INSTANCE_CHART,
        (TIER_FILES["L"],),
        (
            *charts.REQUIRED,
            "postgresql.bundled.enabled=true",
            "postgresql.existingSecret=acme-postgresql",
        ),
    ),
    "tier L, daily backups to a bucket": lambda: charts.instance(
        "L",
        "backups.enabled=true",
        "backups.store=s3://acme-backups/inst-7f3a",
        "backups.s3.endpoint=https://s3.example.com",
        "backups.s3.existingSecret=acme-backup-store",
    ),
    "tier S, daily backups to a volume": lambda: charts.instance(
        "S",
        "backups.enabled=true",
        "backups.store=file:///backups/inst-7f3a",
        "backups.volume.existingClaim=acme-backups",
    ),
    "collector": lambda: charts.collector(),
    "collector, NetworkPolicy": lambda: charts.collector(
        "networkPolicy.enabled=true",
        "networkPolicy.from[0].namespaceSelector.matchLabels.eventos\\.dev/part-of=instances",
    ),
}


@pytest.mark.parametrize("tier", ["S", "L"])
def test_instance_chart_lints_at_each_tier(tier: str) -> None:
    sets = charts.REQUIRED + (charts.TIER_L_SQL if tier == "L" else ())
    args = ["lint", str(INSTANCE_CHART), "--strict", "-f", str(TIER_FILES[tier])]
    for s in sets:
        args += ["--set", s]
    done = charts.helm(*args)
    assert done.returncode == 0, done.stdout + done.stderr


def test_collector_chart_lints() -> None:
    done = charts.helm("lint", str(COLLECTOR_CHART), "--strict")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", list(RENDERS))
def test_every_rendered_manifest_is_valid_kubernetes(name: str) -> None:
    docs = RENDERS[name]()
    assert docs
    errors = []
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        for version in KUBERNETES:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                errors.append(f"{doc['kind']}/{doc['metadata']['name']} @{version}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_the_validator_refuses_a_broken_manifest() -> None:
    """The check above can fail: an unknown field and a wrong type are refused."""
    deployment = charts.named(charts.instance("S"), "Deployment", "acme-eventos-ingress")
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, KUBERNETES[0], strict=True)
    deployment["spec"]["replicas"] = 1
    deployment["spec"]["template"]["spec"]["containers"][0]["bogus"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, KUBERNETES[0], strict=True)


def test_only_known_crd_kinds_are_left_out_of_the_schema_check() -> None:
    kinds = {d["kind"] for render in RENDERS.values() for d in render()}
    unknown = set()
    for kind in kinds - CRD_KINDS:
        doc = next(d for render in RENDERS.values() for d in render() if d["kind"] == kind)
        try:
            kv.validate(doc, KUBERNETES[0], strict=True)
        except kv.SchemaNotFoundError:
            unknown.add(kind)
    assert not unknown, f"kinds without a Kubernetes schema: {unknown}"
