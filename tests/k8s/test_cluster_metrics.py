"""metrics-server through the aggregation layer: the node's and pods' usage, as the HPA reads it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once


def test_the_metrics_api_reports_the_node_and_the_pods(cluster: Cluster) -> None:
    node = cluster.wait_json("/apis/metrics.k8s.io/v1beta1/nodes/127.0.0.1", timeout_s=120)
    assert node["usage"]["cpu"] and node["usage"]["memory"].endswith("Ki")

    pods = cluster.wait_json("/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods",
                             timeout_s=120, until=lambda d: bool(d["items"]))  # fmt: skip
    names = {item["metadata"]["name"].rsplit("-", 2)[0] for item in pods["items"]}
    assert {"coredns", "metrics-server"} <= names
