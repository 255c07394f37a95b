"""The fleet's OpenTelemetry Collector as a real process, for tests: the binary `make tools`
builds (deploy/collector/manifest.yaml), run with the collector chart's rendered configuration
(`helm template`) plus file exporters.

Beside the chart's pipelines (receiver → allowlist → file `out`: what leaves the collector) the
test configuration adds one pipeline per signal straight from the receiver to file `raw`: what
each service sent, before the collector changed anything. Its listeners are moved to loopback
and its own metrics endpoint is switched off, so tests running at once do not collide.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from eventos.local.ports import free_port
from eventos.testing import wait_for_sync

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy/helm/eventos-collector"
STOP_S = 15.0


def version() -> str:
    """The collector release the chart pins (its appVersion)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return str(chart["appVersion"])


def binary() -> Path:
    """The collector `make tools` builds; fails (never skips) when it is missing."""
    path = ROOT / f".tools/bin/otelcol-eventos-v{version()}"
    if not path.is_file():
        raise AssertionError(f"{path} not found: run `make tools` (it builds the collector)")
    return path


def helm() -> str:
    path = os.environ.get("EVENTOS_HELM") or str(ROOT / ".tools/bin/helm")
    if not Path(path).is_file():
        raise AssertionError(f"helm not found at {path}: run `make tools`")
    return path


def rendered(values: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """The collector configuration the chart renders with `values`."""
    values_file = workdir / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    done = subprocess.run([helm(), "template", "eg15", str(CHART), "-f", str(values_file)],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    for doc in yaml.safe_load_all(done.stdout):
        if doc and doc["kind"] == "ConfigMap":
            config: dict[str, Any] = yaml.safe_load(doc["data"]["config.yaml"])
            return config
    raise AssertionError("the collector chart rendered no ConfigMap")


def loopback(endpoint: str) -> str:
    return "127.0.0.1:" + endpoint.rsplit(":", 1)[1]


@dataclass
class Collector:
    """One collector process and its two outputs (`raw` before it, `out` after it)."""

    workdir: Path
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def raw(self) -> Path:
        return self.workdir / "raw.jsonl"

    @property
    def out(self) -> Path:
        return self.workdir / "out.jsonl"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def config(self) -> dict[str, Any]:
        ports = {"otlpGrpc": self.grpc_port, "otlpHttp": self.http_port,
                 "health": self.health_port}  # fmt: skip
        out = {"path": str(self.out), "flush_interval": "200ms"}
        cfg = rendered({"ports": ports, "exporters": {"file/out": out},
                        "pipelines": {"metrics": ["file/out"], "logs": ["file/out"]}},
                       self.workdir)  # fmt: skip
        protocols = cfg["receivers"]["otlp"]["protocols"]
        for proto in protocols.values():
            proto["endpoint"] = loopback(proto["endpoint"])
        health = cfg["extensions"]["health_check"]
        health["endpoint"] = loopback(health["endpoint"])
        cfg["exporters"]["file/raw"] = {"path": str(self.raw), "flush_interval": "200ms"}
        pipelines = cfg["service"]["pipelines"]
        for signal in ("metrics", "logs"):
            pipelines[f"{signal}/raw"] = {"receivers": ["otlp"], "exporters": ["file/raw"]}
        cfg["service"]["telemetry"] = {"metrics": {"level": "none"}}
        return cfg

    def start(self) -> None:
        path = self.workdir / "config.yaml"
        path.write_text(yaml.safe_dump(self.config()))
        log = (self.workdir / "collector.log").open("wb")
        self.process = subprocess.Popen([str(binary()), f"--config={path}"], stdout=log,
                                        stderr=subprocess.STDOUT)  # fmt: skip
        wait_for_sync(self.healthy, timeout=60, what="the collector is healthy")

    def healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the collector exited:\n{self.log()}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.health_port}/", timeout=2).is_success
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return (self.workdir / "collector.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_S)


def batches(path: Path) -> list[dict[str, Any]]:
    """The OTLP/JSON requests a file exporter wrote, one a line. The exporter may be writing
    while we read: a last line without its newline is not complete yet, and is left out."""
    if not path.is_file():
        return []
    complete = path.read_text().rpartition("\n")[0]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]
