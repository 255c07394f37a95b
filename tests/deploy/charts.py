"""Rendering the Helm charts with the real helm binary, for the deploy tests.

helm comes from `EVENTOS_HELM` or `.tools/bin/helm` (which `make test` installs); without it the
tests fail loudly instead of skipping.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
INSTANCE_CHART = ROOT / "deploy/helm/eventos"
COLLECTOR_CHART = ROOT / "deploy/helm/eventos-collector"
TIER_FILES = {
    "S": INSTANCE_CHART / "values-tier-s.yaml",
    "L": INSTANCE_CHART / "values-tier-l.yaml",
}
RELEASE = "acme"
NAMESPACE = "eventos-acme"

# What every install must be given (docs/deploy.md); tier L with an external PostgreSQL also
# needs the Temporal database host and password Secret.
REQUIRED = (
    "instance.id=inst-7f3a",
    "secrets.database.existingSecret=acme-database",
    "secrets.admin.existingSecret=acme-admin",
    "secrets.outbox.existingSecret=acme-outbox",
)
TIER_L_SQL = (
    "temporal.server.sql.host=pg.acme.internal",
    "temporal.server.sql.existingSecret=acme-temporal-sql",
)

Doc = dict[str, Any]


def helm_binary() -> str:
    """The helm v3 binary the checks run; fails (never skips) when it is missing."""
    path = os.environ.get("EVENTOS_HELM") or str(ROOT / ".tools/bin/helm")
    if not Path(path).is_file():
        raise AssertionError(
            f"helm not found at {path}: run `make tools` (or `make test`, which installs it)"
        )
    return path


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run helm; the result is returned whatever its exit code."""
    return subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, timeout=60, check=False
    )


@functools.lru_cache(maxsize=64)
def _template(chart: str, files: tuple[str, ...], sets: tuple[str, ...]) -> str:
    args = ["template", RELEASE, chart, "--namespace", NAMESPACE]
    for f in files:
        args += ["-f", f]
    for s in sets:
        args += ["--set", s]
    done = helm(*args)
    if done.returncode != 0:
        raise RenderError(done.stderr.strip())
    return done.stdout


class RenderError(Exception):
    """helm template refused the values; the message is helm's."""


def render_text(chart: Path, files: tuple[Path, ...] = (), sets: tuple[str, ...] = ()) -> str:
    return _template(str(chart), tuple(str(f) for f in files), sets)


def render(chart: Path, files: tuple[Path, ...] = (), sets: tuple[str, ...] = ()) -> list[Doc]:
    """Every manifest helm renders (a fresh copy, so tests may not disturb each other)."""
    text = render_text(chart, files, sets)
    return [d for d in yaml.safe_load_all(text) if d]


def instance(tier: str, *sets: str) -> list[Doc]:
    """The instance chart at `tier` with the required values and `sets`."""
    base = REQUIRED + (TIER_L_SQL if tier == "L" else ())
    return render(INSTANCE_CHART, (TIER_FILES[tier],), base + sets)


def collector(*sets: str) -> list[Doc]:
    return render(COLLECTOR_CHART, (), sets)


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec(doc: Doc) -> Doc:
    """The pod spec of a Deployment, StatefulSet, Job or Pod (the `helm test` pods)."""
    spec: Doc = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    return spec


def pod_labels(doc: Doc) -> dict[str, str]:
    """The labels of the pods a workload makes (a Pod's own)."""
    meta: Doc = doc["metadata"] if doc["kind"] == "Pod" else doc["spec"]["template"]["metadata"]
    return dict(meta["labels"])


def workloads(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job", "Pod")]


def env_of(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def values(tier: str) -> Doc:
    """The instance chart's values at a tier: values.yaml with the tier file's top-level keys
    over it (enough for checks that read whole blocks, such as llmClasses)."""
    base: Doc = yaml.safe_load((INSTANCE_CHART / "values.yaml").read_text())
    return {**base, **yaml.safe_load(TIER_FILES[tier].read_text())}
