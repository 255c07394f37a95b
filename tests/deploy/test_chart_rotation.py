"""Secrets rotate without a restart on Kubernetes (issue 29 point 6): the chart mounts every
secret the services read as files of a directory (never `subPath`, which the kubelet does not
update), ingress keeps the admin token's file to re-read, and the overlap window is a value."""

from __future__ import annotations

import charts
import pytest
from charts import Doc, env_of, of_kind, pod_spec
from test_chart_exposure import P, deployments, render_error

SECRETS = "/var/run/secrets/eventos"


def config(tier: str, *sets: str) -> dict[str, str]:
    (found,) = [d for d in of_kind(charts.instance(tier, *sets), "ConfigMap")
                if d["metadata"]["name"] == f"{P}-config"]  # fmt: skip
    data: dict[str, str] = found["data"]
    return data


def secret_mounts(deployment: Doc) -> list[Doc]:
    return [m for c in pod_spec(deployment)["containers"] for m in c.get("volumeMounts", [])
            if m["mountPath"].startswith(SECRETS)]  # fmt: skip


@pytest.mark.parametrize("tier", ["S", "L"])
def test_every_secret_is_a_file_the_kubelet_updates(tier: str) -> None:
    found = deployments(tier, "secrets.employees.existingSecret=acme-employees")
    mounted = set()
    for role, deployment in found.items():
        for mount in secret_mounts(deployment):
            assert "subPath" not in mount, f"{role}: {mount['mountPath']} would never rotate"
            assert mount.get("readOnly") is True
            mounted.add(mount["mountPath"])
    assert {f"{SECRETS}/employees", f"{SECRETS}/admin"} <= mounted
    ingress = env_of(pod_spec(found["ingress"])["containers"][0])
    assert ingress["EVENTOS_ADMIN_TOKEN_FILE"]["value"] == f"{SECRETS}/admin/token"
    assert ingress["EVENTOS_SECRETS_DIR"]["value"] == f"{SECRETS}/employees"


@pytest.mark.parametrize("tier", ["S", "L"])
def test_the_overlap_window_is_a_value(tier: str) -> None:
    assert config(tier)["EVENTOS_SECRETS_OVERLAP_S"] == "86400"
    assert (
        config(tier, "secrets.rotationOverlapSeconds=3600")["EVENTOS_SECRETS_OVERLAP_S"] == "3600"
    )


def test_a_negative_overlap_fails_the_render() -> None:
    assert "rotationOverlapSeconds" in render_error("secrets.rotationOverlapSeconds=-1")
