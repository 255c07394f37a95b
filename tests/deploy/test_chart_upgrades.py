"""The instance chart's weekly upgrade CronJob (docs/upgrades.md, "On Kubernetes"): off by
default; Sunday 03:00 UTC; `eventosctl upgrade --to <targetTag>` under its own ServiceAccount
whose Role is this namespace's only and holds only the verbs the upgrader uses; its snapshot
to the backup store when there is one, else to the pod's own volume."""

from __future__ import annotations

import re

import charts
import pytest
from charts import NAMESPACE, Doc, RenderError, env_of, named, of_kind

P = "acme-eventos"
UPGRADES = ("upgrades.enabled=true", "upgrades.targetTag=0.2.0")
S3 = (
    "backups.store=s3://acme-backups/inst-7f3a",
    "backups.s3.endpoint=https://s3.eu-central-1.amazonaws.com",
    "backups.s3.existingSecret=acme-backup-store",
)
# What eventos.fleet.k8s_driver calls, and nothing else.
RULES = {
    ("apps", "deployments"): {"get", "list", "patch"},
    ("", "pods"): {"get", "list"},
    ("", "pods/log"): {"get"},
    ("", "pods/proxy"): {"get"},
    ("batch", "jobs"): {"create", "get", "delete"},
}


def pod(cronjob: Doc) -> Doc:
    spec: Doc = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def test_no_upgrade_cronjob_nor_rbac_unless_enabled() -> None:
    docs = charts.instance("S")
    assert of_kind(docs, "CronJob") == []
    assert of_kind(docs, "Role") == [] and of_kind(docs, "RoleBinding") == []


def test_the_weekly_window_runs_the_upgrader_on_the_target_tag() -> None:
    job = named(charts.instance("S", *UPGRADES), "CronJob", f"{P}-upgrade")
    assert job["spec"]["schedule"] == "0 3 * * 0"  # Sunday 03:00
    assert job["spec"]["timeZone"] == "Etc/UTC"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    assert job["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 0
    spec = pod(job)
    (container,) = spec["containers"]
    assert container["args"] == ["eventosctl", "upgrade", "--to", "0.2.0", "-o", "json"]
    assert container["image"].endswith("/ingress:0.1.0")  # the current release's code runs it
    env = {k: v.get("value") for k, v in env_of(container).items()}
    assert env["EVENTOS_UPGRADE_RELEASE"] == "acme"
    assert env["EVENTOS_UPGRADE_READY_S"] == "90"
    assert container["envFrom"] == [{"configMapRef": {"name": f"{P}-config"}}]
    other = named(charts.instance("S", *UPGRADES, "upgrades.schedule=30 4 * * 6"), "CronJob",
                  f"{P}-upgrade")  # fmt: skip
    assert other["spec"]["schedule"] == "30 4 * * 6"


def test_its_rbac_is_the_namespaces_only_and_holds_only_what_the_upgrader_does() -> None:
    for tier in ("S", "L"):
        docs = charts.instance(tier, *UPGRADES, *S3)
        assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
        role = named(docs, "Role", f"{P}-upgrade")
        assert role["metadata"].get("namespace") in (None, NAMESPACE)
        granted: dict[tuple[str, str], set[str]] = {}
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.setdefault((group, resource), set()).update(rule["verbs"])
        assert granted == RULES
        binding = named(docs, "RoleBinding", f"{P}-upgrade")
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": f"{P}-upgrade"}  # fmt: skip
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{P}-upgrade",
                                        "namespace": NAMESPACE}]  # fmt: skip
        spec = pod(named(docs, "CronJob", f"{P}-upgrade"))
        assert spec["serviceAccountName"] == f"{P}-upgrade"
        assert spec["automountServiceAccountToken"] is True
        # No other pod of the chart runs with the upgrader's account or any token.
        for doc in charts.workloads(docs):
            other = charts.pod_spec(doc)
            assert other.get("serviceAccountName") != f"{P}-upgrade"


def test_the_snapshot_goes_to_the_backup_store_or_to_the_pods_own_volume() -> None:
    spec = pod(named(charts.instance("S", *UPGRADES), "CronJob", f"{P}-upgrade"))
    env = {k: v.get("value") for k, v in env_of(spec["containers"][0]).items()}
    assert env["EVENTOS_BACKUP_STORE"] == "file:///snapshots"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["backups"]
    assert spec["initContainers"][0]["name"] == "pg-tools"
    spec = pod(named(charts.instance("L", *UPGRADES, *S3), "CronJob", f"{P}-upgrade"))
    env = {k: v.get("value") for k, v in env_of(spec["containers"][0]).items()}
    assert env["EVENTOS_BACKUP_STORE"] == "s3://acme-backups/inst-7f3a"
    assert env["EVENTOS_BACKUP_TEMPORAL_DATABASE_URL"].endswith("dbname=temporal")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["backup-store"]["secret"]["secretName"] == "acme-backup-store"
    for container in spec["initContainers"] + spec["containers"]:
        ctx = {**spec["securityContext"], **container["securityContext"]}
        assert ctx["runAsNonRoot"] is True and ctx["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("upgrades.enabled=true",), "upgrades.targetTag is required"),
        (("upgrades.enabled=true", "upgrades.targetTag=no/tag"), "targetTag"),
    ],
)
def test_an_upgrade_without_a_valid_target_fails_the_render(
    sets: tuple[str, ...], message: str
) -> None:
    with pytest.raises(RenderError, match=re.escape(message)):
        charts.instance("S", *sets)
