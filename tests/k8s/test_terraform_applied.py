"""Terraform on the cluster (issue 28, point 7): the example environment, with OpenTofu and the
providers `make terraform-tools` built into a local mirror (no registry), is initialised,
validated, planned and applied: the namespaces, every Secret the chart names (the generated
admin, internal and outbox credentials, the gRPC TLS Secret, the bundled PostgreSQL's password)
and both releases. A second plan changes nothing; an upgrade (a new llm.endpoints) keeps the
generated credentials; destroy removes the namespaces.

The instance runs the bundled PostgreSQL, so the module does not let helm wait for its pods (the
migration Job runs post-install and the services are unready until it ran); helm still waits for
that Job: the release is `deployed` only once the migration reached PostgreSQL with the generated
password through the generated database URL. The test then waits for every workload to be Ready
itself, with a deadline.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from k8s_cluster import KUBECONFIG, REPO

from eventos.testing import wait_for_sync

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(1500)]  # apply's hook and the pods: minutes
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once

TOFU = Path(os.environ.get("EVENTOS_TOFU") or REPO / ".tools/bin/tofu")
CLI_CONFIG = REPO / ".tools/terraform/tofurc"  # written by make terraform-tools: the mirror only
IMAGE_VALUES = REPO / ".eventos/images/values-eventos.yaml"  # written by make images
COLLECTOR_IMAGE_VALUES = REPO / ".eventos/images/values-eventos-collector.yaml"
NAME = "tf-acme"  # the instance: release tf-acme in namespace eventos-tf-acme
NAMESPACE = f"eventos-{NAME}"
COLLECTOR_NAMESPACE = "eventos-tf-telemetry"
PROVIDERS = ("hashicorp/kubernetes", "hashicorp/helm", "hashicorp/random")
LLM_ENDPOINTS = {"local-gw": {"base_url": "http://llm.example.internal/v1", "credentials": ["gw"]}}
GENERATED = {"admin": "token", "internal": "token", "outbox": "keys", "postgresql": "password"}
PLAN_LINE = re.compile(r"^Plan: (\d+) to add, (\d+) to change, (\d+) to destroy\.$", re.M)
HELM_TIMEOUT_S = 420  # the release's hooks (the migration Job); tofu itself is given more
TOFU_TIMEOUT_S = 900
# The node's 2 cores are shared with other releases: tier S's CPU requests (about 1.5 cores with
# the collector) would leave pods Pending, so this instance asks for little CPU.
SHARED_NODE_SIZES = {
    "small": {"requests": {"cpu": "10m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
    "medium": {"requests": {"cpu": "10m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
}
# The migration Job starts with PostgreSQL's first start (initdb) and does not wait for it: on
# the loaded node, four attempts (the chart's backoffLimit 3) did not always outlast it.
MIGRATIONS = {"backoffLimit": 10}
SHARED_NODE_COLLECTOR = {"replicas": 1, "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}}}
READY_TIMEOUT_S = 420


class Tofu:
    """The tofu CLI in a copy of deploy/ (the example and the charts it installs)."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.vars = ""  # the -var-file argument last written

    def run(self, *args: str, ok: tuple[int, ...] = (0,)) -> tuple[int, str]:
        """Run `tofu ARGS`; its exit code and output, failing the test on another code."""
        done = subprocess.run([str(TOFU), *args], cwd=self.workdir, env=self.env, text=True,
                              capture_output=True, timeout=TOFU_TIMEOUT_S)  # fmt: skip
        out = done.stdout + done.stderr
        print(f"$ tofu {' '.join(args)}\n{out}")
        assert done.returncode in ok, f"tofu {' '.join(args)} exited {done.returncode}:\n{out}"
        return done.returncode, out

    def var_file(self, values: dict[str, Any]) -> str:
        """Write the environment's non-secret variables; the -var-file argument."""
        path = self.workdir / "test.tfvars.json"
        path.write_text(json.dumps(values, indent=2))
        self.vars = f"-var-file={path}"
        return self.vars


def grpc_tls_pair(folder: Path) -> tuple[str, str]:
    """A self-signed certificate and key for ingress's gRPC port (openssl, P-256)."""
    key, crt = folder / "grpc.key", folder / "grpc.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj",
                    f"/CN={NAME}-eventos-ingress.{NAMESPACE}.svc", "-keyout", str(key),
                    "-out", str(crt)], check=True, capture_output=True)  # fmt: skip
    return crt.read_text(), key.read_text()


def environment(kubeconfig: Path, llm_endpoints: dict[str, Any], cert: str) -> dict[str, Any]:
    """The example's variables: one tier S instance with its own PostgreSQL, local images."""
    images = yaml.safe_load(IMAGE_VALUES.read_text())
    collector = yaml.safe_load(COLLECTOR_IMAGE_VALUES.read_text())
    return {
        "kubeconfig": str(kubeconfig),
        "collector_namespace": COLLECTOR_NAMESPACE,
        "collector_extra_values": {**collector, **SHARED_NODE_COLLECTOR},
        "instances": {
            NAME: {
                "tier": "S",
                "instance_id": "inst-tf01",
                "bundled_postgresql": True,
                "llm_endpoints": llm_endpoints,
                "grpc_tls_cert": cert,
            }
        },
        "image_repository": images["image"]["repository"],
        "image_tag": images["image"]["tag"],
        "extra_values": {**images, "sizes": SHARED_NODE_SIZES, "migrations": MIGRATIONS},
        "helm_timeout_s": HELM_TIMEOUT_S,
    }


@pytest.fixture
def tofu(cluster: Cluster, tmp_path: Path) -> Iterator[Tofu]:
    """tofu in a copy of deploy/terraform and deploy/helm; whatever it made is gone afterwards."""
    for tool in (TOFU, CLI_CONFIG, IMAGE_VALUES, COLLECTOR_IMAGE_VALUES):
        assert tool.is_file(), f"{tool} is missing: run `make terraform-tools` and `make images`"
    for part in ("terraform", "helm"):
        shutil.copytree(REPO / "deploy" / part, tmp_path / "deploy" / part,
                        ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*", "tofu"))  # fmt: skip
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(CLI_CONFIG), "TF_IN_AUTOMATION": "1",
           "TF_INPUT": "0", "TF_PLUGIN_CACHE_DIR": "", "NO_COLOR": "1"}  # fmt: skip
    runner = Tofu(tmp_path / "deploy/terraform/envs/example", env)
    yield runner
    print(cluster.kubectl("get", "pods,jobs", "-n", NAMESPACE, check=False))
    print(cluster.kubectl("logs", "-n", NAMESPACE, f"job/{NAME}-eventos-migrate", "--tail=20",
                          check=False))  # fmt: skip
    if (runner.workdir / "terraform.tfstate").exists() and runner.vars:
        runner.run("destroy", "-auto-approve", "-no-color", runner.vars, ok=(0, 1))
    for namespace in (NAMESPACE, COLLECTOR_NAMESPACE):
        cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")


def secret_data(cluster: Cluster, name: str) -> dict[str, str]:
    """A Secret's data, decoded."""
    data = cluster.get_in(NAMESPACE, "secret", name).get("data", {})
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


def release_status(cluster: Cluster, namespace: str, name: str) -> dict[int, str]:
    """Helm's release records (Secrets labelled owner=helm): revision -> status."""
    out = cluster.kubectl("get", "secret", "-n", namespace, "-l", f"owner=helm,name={name}",
                          "-o", "json")  # fmt: skip
    return {int(s["metadata"]["labels"]["version"]): s["metadata"]["labels"]["status"]
            for s in json.loads(out)["items"]}  # fmt: skip


def plan_summary(out: str) -> tuple[int, int, int]:
    """The plan's "Plan: N to add, N to change, N to destroy." line, as numbers."""
    found = PLAN_LINE.search(out)
    assert found, f"no plan summary in:\n{out}"
    print(f"plan summary: {found.group(0)}")
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


def test_the_example_is_planned_applied_kept_and_destroyed(
    cluster: Cluster, tofu: Tofu, tmp_path: Path
) -> None:
    cert, key = grpc_tls_pair(tmp_path)
    tofu.env["TF_VAR_instance_secrets"] = json.dumps({NAME: {"grpc_tls_key": key}})
    var_file = tofu.var_file(environment(KUBECONFIG, LLM_ENDPOINTS, cert))

    _, out = tofu.run("init", "-no-color")
    for provider in PROVIDERS:  # from the mirror: nothing is signed, nothing was downloaded
        assert re.search(rf"Installed {provider} v[\d.]+ \(unauthenticated\)", out), provider
    assert tofu.run("validate", "-no-color")[1].strip().startswith("Success!")

    _, out = tofu.run("plan", "-no-color", "-out=tfplan", var_file)
    add, change, destroy = plan_summary(out)
    assert add >= 15 and (change, destroy) == (0, 0)
    _, out = tofu.run("apply", "-no-color", "tfplan")
    assert f"Apply complete! Resources: {add} added, 0 changed, 0 destroyed." in out

    check_what_was_made(cluster, key, cert)
    for namespace in (NAMESPACE, COLLECTOR_NAMESPACE):
        wait_ready(cluster, namespace)
    kept = {name: secret_data(cluster, f"{NAME}-{name}") for name in GENERATED}

    code, out = tofu.run("plan", "-no-color", "-detailed-exitcode", var_file)
    assert code == 0 and "No changes." in out

    # An upgrade: one more allowed LLM endpoint is a new revision of the release, nothing else.
    more = {**LLM_ENDPOINTS, "other": {"base_url": "https://llm2.example.internal/v1"}}
    var_file = tofu.var_file(environment(KUBECONFIG, more, cert))
    _, out = tofu.run("apply", "-no-color", "-auto-approve", var_file)
    assert "Apply complete! Resources: 0 added, 1 changed, 0 destroyed." in out
    assert release_status(cluster, NAMESPACE, NAME)[2] == "deployed"
    assert json.loads(ingress_env(cluster)["EVENTOS_LLM_ENDPOINTS"])["other"]
    assert {name: secret_data(cluster, f"{NAME}-{name}") for name in GENERATED} == kept

    _, out = tofu.run("destroy", "-no-color", "-auto-approve", var_file)
    assert re.search(rf"Destroy complete! Resources: {add} destroyed\.", out), out
    for namespace in (NAMESPACE, COLLECTOR_NAMESPACE):
        wait_for_sync(lambda ns=namespace: not cluster.kubectl("get", "namespace", ns,
                                                               "--ignore-not-found"),
                      timeout=120, interval=1, what=f"namespace {namespace} gone")  # fmt: skip
    cluster.run_cluster("recycle")  # the bundled PostgreSQL's volume, released with its claim


def wait_ready(cluster: Cluster, namespace: str) -> None:
    """Wait until every Deployment and StatefulSet of the namespace has all its replicas Ready."""

    def unready() -> list[str]:
        out = cluster.kubectl("get", "deployments,statefulsets", "-n", namespace, "-o", "json")
        items = json.loads(out)["items"]
        if not items:
            return ["no workload yet"]
        return [i["metadata"]["name"] for i in items
                if i["status"].get("readyReplicas", 0) < i["spec"]["replicas"]]  # fmt: skip

    try:
        wait_for_sync(lambda: not unready(), timeout=READY_TIMEOUT_S, interval=2,
                      what=f"every workload of {namespace} Ready")  # fmt: skip
    finally:
        print(cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide"))


def ingress_env(cluster: Cluster) -> dict[str, str]:
    """The plain (non-secret) environment of the ingress container."""
    deployment = cluster.get_in(NAMESPACE, "deployment", f"{NAME}-eventos-ingress")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def check_what_was_made(cluster: Cluster, key: str, cert: str) -> None:
    """The namespace, each Secret with its keys, both releases deployed, the hook's Job done."""
    labels = cluster.get_in("", "namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["eventos.dev/tier"] == "S" and labels["eventos.dev/instance-id"] == "inst-tf01"
    generated = {name: secret_data(cluster, f"{NAME}-{name}") for name in GENERATED}
    assert {name: list(data) for name, data in generated.items()} == {
        name: [k] for name, k in GENERATED.items()
    }
    assert re.fullmatch(r"[A-Za-z0-9]{48}", generated["admin"]["token"])
    assert re.fullmatch(r"[0-9a-f]{64}", generated["internal"]["token"])
    assert len(base64.b64decode(generated["outbox"]["keys"].removeprefix("k1:"))) == 32
    password = generated["postgresql"]["password"]
    assert secret_data(cluster, f"{NAME}-database")["url"] == (
        f"postgresql://postgres:{password}@{NAME}-eventos-postgresql.{NAMESPACE}.svc:5432/eventos"
    )
    tls = cluster.get_in(NAMESPACE, "secret", f"{NAME}-grpc-tls")
    assert tls["type"] == "kubernetes.io/tls"
    assert secret_data(cluster, f"{NAME}-grpc-tls") == {"tls.crt": cert, "tls.key": key}
    assert secret_data(cluster, f"{NAME}-employees") == {}

    assert release_status(cluster, NAMESPACE, NAME) == {1: "deployed"}
    assert release_status(cluster, COLLECTOR_NAMESPACE, "eventos-collector") == {1: "deployed"}
    env = ingress_env(cluster)
    assert json.loads(env["EVENTOS_LLM_ENDPOINTS"]) == {
        name: {"credentials": [], **spec} for name, spec in LLM_ENDPOINTS.items()
    }
    assert "EVENTOS_INGRESS_GRPC_INSECURE" not in env  # the TLS Secret is mounted instead
