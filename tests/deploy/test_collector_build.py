"""The collector `make tools` builds is the chart's: its builder manifest lists exactly the
components the chart's configuration can name, every module at the chart's pinned release, and
the built binary accepts the configurations the chart renders."""

from __future__ import annotations

import subprocess
from pathlib import Path

import charts
import yaml
from charts import ROOT, named

MANIFEST = ROOT / "deploy/collector/manifest.yaml"
NAME = "acme-eventos-collector"
KINDS = ("receivers", "processors", "exporters", "extensions")
# Each component id of the configuration, by the module that provides it.
MODULES = {
    "otlp": "receiver/otlpreceiver",
    "memory_limiter": "processor/memorylimiterprocessor",
    "batch": "processor/batchprocessor",
    "transform": "processor/transformprocessor",
    "debug": "exporter/debugexporter",
    "otlphttp": "exporter/otlphttpexporter",
    "file": "exporter/fileexporter",
    "health_check": "extension/healthcheckextension",
}
# Every exporter the chart's values document: the default, the backend example, the tests'.
EXAMPLE = (
    "exporters.otlphttp/backend.endpoint=https://otlp.example.com",
    "exporters.file/out.path=/tmp/out.jsonl",
    "pipelines.metrics={otlphttp/backend,file/out}",
    "pipelines.logs={debug,file/out}",
)


def manifest() -> dict[str, list[str]]:
    doc = yaml.safe_load(MANIFEST.read_text())
    return {kind: [entry["gomod"] for entry in doc.get(kind, [])] for kind in (*KINDS, "providers")}


def config(*sets: str) -> dict[str, dict[str, object]]:
    loaded: dict[str, dict[str, object]] = yaml.safe_load(
        named(charts.collector(*sets), "ConfigMap", NAME)["data"]["config.yaml"]
    )
    return loaded


def used_modules(*configs: dict[str, dict[str, object]]) -> set[str]:
    ids = {key.split("/")[0] for cfg in configs for kind in KINDS for key in cfg.get(kind, {})}
    return {MODULES[i] for i in ids}


def test_the_manifest_lists_exactly_the_components_the_chart_uses() -> None:
    listed = {
        "/".join(mod.split()[0].split("/")[-2:]) for kind in KINDS for mod in manifest()[kind]
    }
    assert listed == used_modules(config(), config(*EXAMPLE))


def test_every_module_is_at_the_charts_release() -> None:
    app_version = yaml.safe_load((charts.COLLECTOR_CHART / "Chart.yaml").read_text())["appVersion"]
    minor = int(app_version.split(".")[1])
    doc = yaml.safe_load(MANIFEST.read_text())
    assert doc["dist"]["version"] == app_version
    for kind, modules in manifest().items():
        for mod in modules:
            version = mod.split()[1]
            # Stable modules (v1.x) are released with each v0.x: v0.161 goes with v1.67.
            expected = f"v1.{minor - 94}.0" if kind == "providers" else f"v{app_version}"
            assert version == expected, mod
    image = yaml.safe_load((charts.COLLECTOR_CHART / "values.yaml").read_text())["image"]
    assert image.endswith(f":{app_version}")


def collector_binary() -> Path:
    app_version = yaml.safe_load((charts.COLLECTOR_CHART / "Chart.yaml").read_text())["appVersion"]
    path = ROOT / f".tools/bin/otelcol-eventos-v{app_version}"
    assert path.is_file(), f"{path} not found: run `make tools` (it builds the collector)"
    return path


def test_the_built_collector_accepts_every_configuration_the_chart_renders(tmp_path: Path) -> None:
    for n, sets in enumerate(((), EXAMPLE)):
        path = tmp_path / f"config-{n}.yaml"
        path.write_text(yaml.safe_dump(config(*sets)))
        done = subprocess.run([str(collector_binary()), "validate", f"--config={path}"],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
