"""The `local` StorageClass: a claim binds and its data outlives the pod that wrote it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once


def claim_volume(claim: str) -> dict[str, object]:
    """Pod spec fields that mount the claim at /data."""
    return {
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        "volume_mounts": [{"name": "data", "mountPath": "/data"}],
    }


def test_a_claim_binds_on_the_local_class_and_its_data_survives_the_pod(cluster: Cluster) -> None:
    claim = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "notes"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                 "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    cluster.apply(claim)
    cluster.run_probe("writer", "write", "/data/note", "kept across pods", **claim_volume("notes"))
    assert cluster.get("pvc", "notes")["status"]["phase"] == "Bound"

    cluster.kubectl("delete", "-n", cluster.namespace, "pod", "writer", "--wait=true")
    assert cluster.run_probe("reader", "cat", "/data/note", **claim_volume("notes")) == (
        "kept across pods"
    )
