"""The Kubernetes driver's decisions, without a cluster (tests/k8s/test_upgrade_on_cluster.py
runs it on one): which image and environment each Deployment gets forward and back, what the
steps' Jobs look like, when a rollout counts as done, what a stop keeps, and when
`eventosctl upgrade` drives Kubernetes at all."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import pytest

from eventos.cli.upgrade import _instance
from eventos.errors import ConfigError
from eventos.fleet import k8s_driver
from eventos.fleet.k8s_driver import (
    REPLICAS_ANNOTATION,
    KubernetesInstance,
    Role,
    image_with_tag,
    job_manifest,
    rollout_pending,
    tag_of,
)
from eventos.fleet.local_driver import LocalInstance
from eventos.fleet.upgrade import INNER, SERVICES, WORKERS, ReleaseRef
from eventos.settings import KubernetesUpgradeSettings, UpgradeSettings

WHERE = KubernetesUpgradeSettings(namespace="ns", release="rel", kubeconfig="/k")
OLD = ReleaseRef("a1", "localhost/eventos/ingress:a1", "build-a", 40)
NEW = ReleaseRef("b2", "localhost/eventos/ingress:b2", "build-b", 41)
OWN_ENV = [{"name": "EVENTOS_INGRESS_HTTP_PORT", "value": "8080"},
           {"name": "EVENTOS_IMAGE_TAG", "value": "a0"}]  # fmt: skip


def test_a_tag_replaces_only_the_tag() -> None:
    assert image_with_tag("localhost/eventos/router:41349c8", "b2") == "localhost/eventos/router:b2"
    assert image_with_tag("registry:5000/eventos/router", "b2") == "registry:5000/eventos/router:b2"
    assert image_with_tag("r:5000/e/router:a@sha256:00", "b2") == "r:5000/e/router:b2"
    assert tag_of("registry:5000/eventos/router") == ""
    assert tag_of("registry:5000/eventos/router:a1") == "a1"


def test_a_steps_job_is_the_ingress_pod_without_its_service_face() -> None:
    template = {
        "metadata": {"labels": {"app.kubernetes.io/instance": "rel",
                                "app.kubernetes.io/component": "ingress"}},
        "spec": {"serviceAccountName": "rel-eventos", "automountServiceAccountToken": False,
                 "volumes": [{"name": "database", "secret": {"secretName": "rel-database"}}],
                 "containers": [{"name": "ingress", "image": "e/ingress:a1", "args": ["python"],
                                 "ports": [{"name": "http", "containerPort": 8080}],
                                 "readinessProbe": {}, "livenessProbe": {}, "env": OWN_ENV}]},
    }  # fmt: skip
    job = job_manifest(template, name="j", image="e/ingress:b2", args=["eventosctl", "migrate"],
                       tag="b2", deadline_s=600)  # fmt: skip
    pod = job["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    # No Service selects it (the ingress Service would send it webhooks); the NetworkPolicies
    # that let the release's pods reach PostgreSQL and Temporal still do.
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "upgrade-step"
    assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"
    assert container["image"] == "e/ingress:b2"
    assert container["args"] == ["eventosctl", "migrate"]
    assert not {"ports", "readinessProbe", "livenessProbe"} & set(container)
    assert [e for e in container["env"] if e["name"] == "EVENTOS_IMAGE_TAG"] == [
        {"name": "EVENTOS_IMAGE_TAG", "value": "b2"}
    ]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["volumes"] == template["spec"]["volumes"]
    assert job["spec"]["backoffLimit"] == 0
    assert template["spec"]["containers"][0]["ports"], "the Deployment's template is not changed"


def deployment(want: int, **status: int) -> dict[str, Any]:
    return {"metadata": {"generation": 3}, "spec": {"replicas": want},
            "status": {"observedGeneration": 3, **status}}  # fmt: skip


@pytest.mark.parametrize(
    ("found", "pending"),
    [
        (deployment(2, replicas=2, updatedReplicas=2, readyReplicas=2), None),
        (deployment(2, replicas=3, updatedReplicas=2, readyReplicas=2), "1 old replicas"),
        (deployment(2, replicas=2, updatedReplicas=1, readyReplicas=2), "1/2 replicas updated"),
        (deployment(2, replicas=2, updatedReplicas=2, readyReplicas=1), "1/2 replicas Ready"),
        ({**deployment(1), "status": {"observedGeneration": 2}}, "not observed"),
        (deployment(0), None),
    ],
)
def test_a_rollout_is_done_when_every_replica_is_new_and_ready(
    found: dict[str, Any], pending: str | None
) -> None:
    said = rollout_pending(found)
    assert (said is None) if pending is None else (pending in str(said))


def instance_with_roles() -> tuple[KubernetesInstance, list[tuple[str, Any]]]:
    instance = KubernetesInstance(WHERE, UpgradeSettings())
    for service in SERVICES:
        name = f"rel-eventos-{service}"
        instance.roles[name] = Role(name, service, 0, f"localhost/eventos/{service}:a1",
                                    list(OWN_ENV), 2, f"component={service}")  # fmt: skip
    instance.old = OLD
    patches: list[tuple[str, Any]] = []

    async def patch(name: str, body: Any) -> None:
        patches.append((name, body))

    instance._patch = patch  # type: ignore[method-assign]
    return instance, patches


def ops(body: list[dict[str, Any]]) -> dict[str, Any]:
    return {op["path"].rsplit("/", 1)[1]: op["value"] for op in body}


def test_forward_runs_the_target_tag_and_the_drill_back_runs_exactly_what_was() -> None:
    instance, patches = instance_with_roles()
    asyncio.run(instance.start(NEW, WORKERS, drill=True))
    forward = {n: ops(b) for n, b in patches if isinstance(b, list)}
    assert set(forward) == {"rel-eventos-workers-workflow", "rel-eventos-workers-llm"}
    llm = forward["rel-eventos-workers-llm"]
    assert llm["image"] == "localhost/eventos/workers-llm:b2"
    assert llm["replicas"] == 2
    assert {"name": "EVENTOS_IMAGE_TAG", "value": "b2"} in llm["env"]
    assert {"name": "EVENTOS_DRILL_READINESS_FAILURE", "value": "1"} in llm["env"]
    assert len([e for e in llm["env"] if e["name"] == "EVENTOS_IMAGE_TAG"]) == 1
    # Each started Deployment forgets the replicas its stop kept.
    kept = [b for _, b in patches if isinstance(b, dict)]
    assert kept == [{"metadata": {"annotations": {REPLICAS_ANNOTATION: None}}}] * 2
    patches.clear()
    asyncio.run(instance.start(OLD, SERVICES, drill=False))
    back = {n: ops(b) for n, b in patches if isinstance(b, list)}
    assert len(back) == len(SERVICES)
    for name, role in instance.roles.items():
        assert back[name] == {"image": role.image, "env": OWN_ENV, "replicas": 2}


def test_a_stop_keeps_the_replicas_where_the_next_run_finds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    instance, patches = instance_with_roles()

    async def none_left() -> list[str]:
        return []

    monkeypatch.setattr(instance, "_pods_left", none_left)
    asyncio.run(instance.stop())
    assert {n for n, _ in patches} == set(instance.roles)
    for _, body in patches:
        assert body == {"metadata": {"annotations": {REPLICAS_ANNOTATION: "2"}},
                        "spec": {"replicas": 0}}  # fmt: skip

    # A run that died after its stop: the next one reads the replicas from the annotation.
    def listed(service: str) -> dict[str, Any]:
        return {"metadata": {"name": f"rel-eventos-{service}",
                             "annotations": {REPLICAS_ANNOTATION: "3"}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"c": service}},
                         "template": {"spec": {"containers": [
                             {"name": service, "image": f"e/{service}:a1"}]}}}}  # fmt: skip

    async def deployments() -> list[dict[str, Any]]:
        return [listed(s) for s in SERVICES] + [listed("temporal")]

    async def release_of(image: str, tag: str) -> ReleaseRef:
        return ReleaseRef(tag, image, "build-a", 40)

    monkeypatch.setattr(instance, "_deployments", deployments)
    monkeypatch.setattr(instance, "_release_of", release_of)
    assert asyncio.run(instance.current()).name == "a1"
    assert {r.service for r in instance.roles.values()} == set(SERVICES)  # not Temporal's
    assert {r.replicas for r in instance.roles.values()} == {3}


def test_mixed_tags_or_a_missing_service_refuse_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    instance, _ = instance_with_roles()

    async def deployments() -> list[dict[str, Any]]:
        return [{"metadata": {"name": f"d-{s}"},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"c": s}},
                          "template": {"spec": {"containers": [
                              {"name": s, "image": f"e/{s}:{'b' if s in INNER else 'a'}"}]}}}}
                for s in SERVICES]  # fmt: skip

    monkeypatch.setattr(instance, "_deployments", deployments)
    with pytest.raises(k8s_driver.UpgradeError, match="different image tags"):
        asyncio.run(instance.current())


def args(**kw: str) -> argparse.Namespace:
    base = {"to": "b2", "namespace": None, "release": None, "kubeconfig": None, "stack": None}
    return argparse.Namespace(**{**base, **kw})


def test_the_cli_drives_kubernetes_when_told_where(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("KUBERNETES_SERVICE_HOST", "EVENTOS_UPGRADE_NAMESPACE", "EVENTOS_UPGRADE_RELEASE",
                "EVENTOS_UPGRADE_KUBECONFIG"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    instance, target = _instance(args(namespace="ns", release="rel"), UpgradeSettings())
    assert isinstance(instance, KubernetesInstance) and target == "b2"
    assert instance.where.namespace == "ns" and instance.where.release == "rel"
    with pytest.raises(ConfigError, match="which release"):
        _instance(args(namespace="ns"), UpgradeSettings())
    # A pod of the chart's CronJob: its own cluster, its namespace and release from the env.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("EVENTOS_UPGRADE_NAMESPACE", "eventos")
    monkeypatch.setenv("EVENTOS_UPGRADE_RELEASE", "prod")
    instance, _ = _instance(args(), UpgradeSettings())
    assert isinstance(instance, KubernetesInstance) and instance.where.in_cluster
    # Neither: the local instance, its TARGET a checkout.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    monkeypatch.delenv("EVENTOS_UPGRADE_NAMESPACE")
    stack = tmp_path / "stack.json"
    stack.write_text("{}")
    instance, target = _instance(args(stack=str(stack), to=str(tmp_path)), UpgradeSettings())
    assert isinstance(instance, LocalInstance) and target == str(tmp_path)
