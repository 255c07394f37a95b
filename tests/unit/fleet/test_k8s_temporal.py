"""The Kubernetes driver's Temporal step, without a cluster (tests/k8s/test_temporal_upgrade_on_cluster.py
runs it on one): which Temporal version the instance runs and the target pins, the schema Job made
from the chart's own schema step, the server moved by its two images and waited for on its
version, and a restore that never swaps Temporal's databases under a running server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from eventos.fleet import checks, k8s_driver, reconcile
from eventos.fleet.backups import TemporalServerControl
from eventos.fleet.k8s_driver import (
    COMPONENT_LABEL,
    JOB_COMPONENT,
    RELEASE_AND_PIN,
    REPLICAS_ANNOTATION,
    KubernetesInstance,
    job_manifest,
    temporal_server,
)
from eventos.fleet.upgrade import SERVICES, ReleaseRef, UpgradeError
from eventos.settings import (
    TEMPORAL_PIN_VAR,
    BackupSettings,
    BackupTarget,
    KubernetesUpgradeSettings,
    TemporalSettings,
    UpgradeSettings,
)

WHERE = KubernetesUpgradeSettings(namespace="ns", release="rel", kubeconfig="/k")
OLD = ReleaseRef("a1", "e/ingress:a1", "build-a", 40, "1.31.2")
NEW = ReleaseRef("b2", "e/ingress:b2", "build-b", 41, "1.32.0")
SCRIPT = 'set -eu\ntool --database "$MAIN_DB" update-schema -d /etc/temporal/schema/x\n'
SERVER_IMAGE = "localhost/eventos/temporal-server:1.31.2"
TOOLS_IMAGE = "localhost/eventos/temporal-admin-tools:1.31.2"


def service(name: str) -> dict[str, Any]:
    return {"metadata": {"name": f"rel-eventos-{name}", "labels": {COMPONENT_LABEL: name}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"c": name}},
                     "template": {"metadata": {"labels": {COMPONENT_LABEL: name}},
                                  "spec": {"containers": [{"name": name,
                                                           "image": f"e/{name}:a1"}]}}}}  # fmt: skip


def temporal_deployment(replicas: int = 1, image: str = SERVER_IMAGE) -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": "rel", COMPONENT_LABEL: "temporal"}
    return {
        "metadata": {"name": "rel-eventos-temporal", "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "volumes": [{"name": "password", "secret": {"secretName": "rel-pg"}},
                                 {"name": "tmp", "emptyDir": {}}],
                     "initContainers": [{"name": "schema", "image": TOOLS_IMAGE,
                                         "command": ["/bin/sh", "-c"], "args": [SCRIPT],
                                         "volumeMounts": [{"name": "password",
                                                           "mountPath": "/var/run/secrets/t"}]}],
                     "containers": [{"name": "temporal", "image": image,
                                     "ports": [{"name": "grpc", "containerPort": 7233}],
                                     "readinessProbe": {"tcpSocket": {"port": "grpc"}}}]}}},
        "status": {"observedGeneration": 0},
    }  # fmt: skip


def release_log(pin: str) -> str:
    """What the release Job prints: the SDK's noise, the release, the pin."""
    rel = {"version": "0.1.0", "build": "build-b", "migrations": 41}
    return f"some warning\n{json.dumps(rel)}\n{json.dumps(pin)}\n"


def instance(monkeypatch: pytest.MonkeyPatch, tier: str) -> tuple[KubernetesInstance, list[Any]]:
    """An instance whose API answers from memory: its Deployments (with Temporal's at tier
    L), its Jobs (recorded, the release Job printing pin 1.32.0), its patches (recorded)."""
    found = KubernetesInstance(WHERE, UpgradeSettings())
    calls: list[Any] = []

    async def deployments() -> list[dict[str, Any]]:
        return [service(s) for s in SERVICES] + ([temporal_deployment()] if tier == "L" else [])

    async def job(step: str, image: str, tag: str, args: list[str], timeout_s: float,
                  template: dict[str, Any] | None = None) -> str:  # fmt: skip
        calls.append(("job", step, image, args, template))
        return release_log("1.32.0")

    async def patch(name: str, body: Any) -> None:
        calls.append(("patch", name, body))

    monkeypatch.setattr(found, "_deployments", deployments)
    monkeypatch.setattr(found, "_job", job)
    monkeypatch.setattr(found, "_patch", patch)
    monkeypatch.setattr(found, "_backups", lambda: None)
    return found, calls


def test_tier_l_runs_its_deployments_version_and_the_target_pins_its_images(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found, calls = instance(monkeypatch, "L")
    assert asyncio.run(found.current()).temporal == "1.31.2"  # its Deployment's, not the pin
    assert asyncio.run(found.install("b2")).temporal == "1.32.0"  # the target image's pin
    releases = [c for c in calls if c[0] == "job"]
    assert [(c[1], c[2], c[3][-1]) for c in releases] == [
        ("release", "e/ingress:a1", RELEASE_AND_PIN),
        ("release", "e/ingress:b2", RELEASE_AND_PIN),
    ]

    # Tier S: the dev server is no Deployment of the upgrader's: Temporal does not move.
    found, _ = instance(monkeypatch, "S")
    assert asyncio.run(found.current()).temporal == ""
    assert asyncio.run(found.install("b2")).temporal == ""


def test_the_release_job_reads_the_images_pin_by_its_settings() -> None:
    env = {"PATH": "/usr/bin:/bin", TEMPORAL_PIN_VAR: "1.32.0"}
    done = subprocess.run([sys.executable, "-c", RELEASE_AND_PIN], capture_output=True, text=True,
                          env=env, check=True, timeout=120)  # fmt: skip
    *_, release, pin = done.stdout.strip().splitlines()
    assert json.loads(pin) == "1.32.0" and json.loads(release)["migrations"] > 0
    done = subprocess.run([sys.executable, "-c", RELEASE_AND_PIN], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, check=True, timeout=120)  # fmt: skip
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ""  # an image pinning none


def test_the_schema_step_is_the_charts_init_container_on_the_targets_admin_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found, calls = instance(monkeypatch, "L")
    asyncio.run(found.current())
    calls.clear()
    asyncio.run(found.update_temporal_schema(NEW))
    ((_, step, image, args, template),) = calls
    assert (step, image) == ("temporal-schema", "localhost/eventos/temporal-admin-tools:1.32.0")
    assert args == [SCRIPT]  # the chart's own script, not a second copy of it
    job = job_manifest(template, name="j", image=image, args=args, tag="b2", deadline_s=600)
    pod = job["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert (container["name"], container["image"]) == ("schema", image)
    assert container["volumeMounts"] and pod["spec"]["volumes"][0]["name"] == "password"
    assert not pod["spec"].get("initContainers")
    # Not selected by Temporal's Service (its component label is the upgrader's step's).
    assert pod["metadata"]["labels"][COMPONENT_LABEL] == JOB_COMPONENT
    # The Deployment's template is not changed.
    assert found.temporal is not None
    assert found.temporal.template["spec"]["initContainers"][0]["image"] == TOOLS_IMAGE


def test_without_the_charts_schema_step_the_step_fails_naming_it() -> None:
    deployment = temporal_deployment()
    deployment["spec"]["template"]["spec"]["initContainers"] = []
    server = temporal_server(deployment)
    assert server is not None
    with pytest.raises(UpgradeError, match="no 'schema' init container"):
        server.schema_template("1.32.0")


def rolled_out(image: str) -> dict[str, Any]:
    d = temporal_deployment(image=image)
    d["status"] = {"observedGeneration": 0, "replicas": 1, "updatedReplicas": 1,
                   "readyReplicas": 1}  # fmt: skip
    return d


def test_the_server_moves_by_both_images_and_is_asked_its_version_once_rolled_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found, calls = instance(monkeypatch, "L")
    asyncio.run(found.current())
    calls.clear()
    rollouts = iter([temporal_deployment(), rolled_out("localhost/eventos/temporal-server:1.32.0")])
    asked: list[tuple[str, int]] = []

    async def serves(temporal: Any, version: str, timeout_s: float) -> None:
        asked.append((version, len(calls)))

    async def deployment() -> dict[str, Any]:
        calls.append(("read", "rollout"))
        return next(rollouts)

    monkeypatch.setattr(checks, "temporal_serves", serves)
    monkeypatch.setattr(found, "_temporal_deployment", deployment)
    monkeypatch.setattr(found, "_temporal_settings", lambda: None)
    monkeypatch.setattr(k8s_driver, "POLL_S", 0.0)
    asyncio.run(found.start_temporal(NEW, 30))
    (moved, forgot) = [c[2] for c in calls if c[0] == "patch"]
    assert {op["path"]: op["value"] for op in moved} == {
        "/spec/replicas": 1,
        "/spec/template/spec/containers/0/image": "localhost/eventos/temporal-server:1.32.0",
        "/spec/template/spec/initContainers/0/image": "localhost/eventos/temporal-admin-tools:1.32.0",
    }  # fmt: skip
    assert forgot == {"metadata": {"annotations": {REPLICAS_ANNOTATION: None}}}
    assert asked == [("1.32.0", 4)]  # asked once the second read found the rollout done

    # Back: exactly the images it ran; and a rollout that never ends fails, naming it.
    calls.clear()

    async def deployment_read() -> dict[str, Any]:
        return temporal_deployment()

    monkeypatch.setattr(found, "_temporal_deployment", deployment_read)
    with pytest.raises(
        UpgradeError, match=r"rollout to 1\.31\.2 not done after 0\.2s: 0/1 replicas"
    ):
        asyncio.run(found.start_temporal(OLD, 0.2))
    back = {op["path"]: op["value"] for op in calls[0][2]}
    assert back["/spec/template/spec/containers/0/image"] == SERVER_IMAGE
    assert back["/spec/template/spec/initContainers/0/image"] == TOOLS_IMAGE


def test_a_restore_swaps_temporals_databases_with_the_server_stopped_then_clears_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found, calls = instance(monkeypatch, "L")
    asyncio.run(found.current())
    calls.clear()
    temporal = TemporalSettings(address="t:7233", namespace="default")
    monkeypatch.setattr(
        found,
        "_backups",
        lambda: BackupSettings(
            "file:///s", (BackupTarget("app", "postgresql:///eventos"),), temporal=temporal
        ),
    )
    pods = [object()]  # one Temporal pod until the stop's patch

    async def listed(selector: str) -> list[object]:
        return pods if not any(c[0] == "patch" for c in calls) else []

    async def restore(
        settings: BackupSettings, snapshot: str, *, temporal_server: TemporalServerControl | None
    ) -> None:
        # As restore_backup: the server stopped for the swap, started, then Temporal cleared.
        assert temporal_server is not None
        await temporal_server.stop()
        calls.append(("swap", snapshot))
        await temporal_server.start()
        assert settings.temporal is not None
        await reconcile.clear_temporal(settings.temporal, "restore", 1.0)

    async def start(release: ReleaseRef, timeout_s: float) -> None:
        calls.append(("start_temporal", release.temporal))

    async def clear(settings: TemporalSettings, reason: str, deadline_s: float) -> None:
        calls.append(("clear", settings.address))

    monkeypatch.setattr(found, "_pods", listed)
    monkeypatch.setattr(k8s_driver, "restore_backup", restore)
    monkeypatch.setattr(reconcile, "clear_temporal", clear)
    monkeypatch.setattr(found, "start_temporal", start)
    monkeypatch.setattr(k8s_driver, "POLL_S", 0.0)
    asyncio.run(found.restore("snap-1"))
    stop = {"metadata": {"annotations": {REPLICAS_ANNOTATION: "1"}}, "spec": {"replicas": 0}}
    # The swap runs with no server; the server starts on the version the databases were taken
    # under, and is cleared as every restore clears it.
    assert calls == [("patch", "rel-eventos-temporal", stop), ("swap", "snap-1"),
                     ("start_temporal", "1.31.2"), ("clear", "t:7233")]  # fmt: skip
