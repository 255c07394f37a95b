"""Real pods on the local cluster: the node, a locally built image, Services and DNS."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once


def test_the_node_is_ready_at_the_pinned_version(cluster: Cluster) -> None:
    node = cluster.get("node", "127.0.0.1")
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.4"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def test_a_pod_of_a_locally_built_image_runs_and_its_log_is_read_back(cluster: Cluster) -> None:
    cluster.apply(cluster.probe_pod("hello", ["log", "hello", "from", "a", "scratch", "image"]))
    cluster.wait_phase("hello", "Running")
    assert cluster.logs("hello") == "hello from a scratch image\n"
    status = cluster.get("pod", "hello")["status"]
    assert status["podIP"].startswith("10.244.0.")
    assert status["containerStatuses"][0]["ready"] is True


def test_a_service_resolves_through_coredns_and_answers_from_a_pod(cluster: Cluster) -> None:
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }  # fmt: skip
    cluster.apply(cluster.probe_pod("web", ["serve", "8080"]), service)
    cluster.wait_phase("web", "Running")
    cluster_ip = cluster.get("service", "web")["spec"]["clusterIP"]
    fqdn = f"web.{cluster.namespace}.svc.cluster.local"

    assert cluster.run_probe("lookup-web", "lookup", fqdn) == f"{cluster_ip}\n"
    # The short name through the pod's search path, then HTTP through kube-proxy's rules.
    assert cluster.run_probe("get-web", "get", "http://web/") == "probe web\n"


def test_a_name_outside_the_cluster_is_not_resolved(cluster: Cluster) -> None:
    # CoreDNS has no upstream: the answer is made in the cluster, nothing leaves the machine.
    cluster.apply(cluster.probe_pod("lookup-outside", ["lookup", "example.com"], restart="Never"))
    cluster.wait_phase("lookup-outside", "Failed")
    assert "no such host" in cluster.logs("lookup-outside")
