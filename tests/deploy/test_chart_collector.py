"""The central collector chart: OTLP in over gRPC and HTTP, an allowlist in front of every
exporter (SPEC §13, defence in depth), exporters from values."""

from __future__ import annotations

import re

import charts
import pytest
import yaml
from charts import Doc, RenderError, named, of_kind, pod_spec

NAME = "acme-eventos-collector"


def config(docs: list[Doc]) -> Doc:
    loaded: Doc = yaml.safe_load(named(docs, "ConfigMap", NAME)["data"]["config.yaml"])
    return loaded


def test_receives_otlp_over_grpc_and_http() -> None:
    docs = charts.collector()
    protocols = config(docs)["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"
    ports = {p["name"]: p["port"] for p in named(docs, "Service", NAME)["spec"]["ports"]}
    assert ports["otlp-grpc"] == 4317 and ports["otlp-http"] == 4318
    image = pod_spec(named(docs, "Deployment", NAME))["containers"][0]["image"]
    assert re.fullmatch(r"otel/opentelemetry-collector-contrib:\d+\.\d+\.\d+", image)


def test_every_pipeline_drops_attributes_outside_the_allowlist_before_exporting() -> None:
    cfg = config(charts.collector())
    transform = cfg["processors"]["transform/allowlist"]
    statements = {
        (group, s["context"]): s["statements"]
        for group in ("metric_statements", "log_statements")
        for s in transform[group]
    }
    resource = statements[("metric_statements", "resource")][0]
    assert resource.startswith("keep_keys(attributes, [")
    assert '"eventos.instance.id"' in resource and '"eventos.tier"' in resource
    assert statements[("metric_statements", "scope")] == ["keep_keys(attributes, [])"]
    datapoint = statements[("metric_statements", "datapoint")][0]
    assert '"outcome"' in datapoint
    for forbidden in ("employee", "workflow", "thread", "text", "prompt"):
        assert forbidden not in datapoint
    assert 'set(body, "")' in statements[("log_statements", "log")]
    for pipeline in cfg["service"]["pipelines"].values():
        assert pipeline["receivers"] == ["otlp"]
        assert "transform/allowlist" in pipeline["processors"]
        assert pipeline["processors"][-1] == "batch"


def test_exporters_come_from_values() -> None:
    docs = charts.collector(
        "exporters.otlphttp/backend.endpoint=https://otlp.example.com",
        "pipelines.metrics={otlphttp/backend}",
        "pipelines.logs={otlphttp/backend,debug}",
        "exporterSecret=collector-exporter-env",
    )
    cfg = config(docs)
    assert cfg["exporters"]["otlphttp/backend"] == {"endpoint": "https://otlp.example.com"}
    assert cfg["service"]["pipelines"]["metrics"]["exporters"] == ["otlphttp/backend"]
    container = pod_spec(named(docs, "Deployment", NAME))["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "collector-exporter-env"}}]
    assert not of_kind(docs, "Secret")


def test_a_pipeline_naming_an_unknown_exporter_fails_the_render() -> None:
    with pytest.raises(RenderError, match='names exporter "nope", which is not in exporters'):
        charts.collector("pipelines.logs={nope}")


def test_a_changed_allowlist_restarts_the_collector() -> None:
    def checksum(docs: list[Doc]) -> str:
        deployment = named(docs, "Deployment", NAME)
        value: str = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    assert checksum(charts.collector()) != checksum(charts.collector("allowlist.log={a}"))
