"""`cluster down` leaves the host as the suite found it, after the session's cluster and again
after one more up/down cycle (collected last, by its name: it takes the session's cluster down)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from k8s_cluster import REUSE

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once


def test_down_leaves_the_host_as_before_twice(
    cluster: Cluster,
) -> None:
    if REUSE:
        pytest.skip("EVENTOS_K8S_REUSE: the cluster is not this session's to take down")
    for cycle in (1, 2):
        if cycle == 2:
            cluster.run_cluster("up")
        out = cluster.run_cluster("down")
        assert "the host is as before" in out, out
        assert cluster.host_differences() == [], f"after cycle {cycle}"
