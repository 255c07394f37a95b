"""`cluster down` leaves the host as the suite found it, after the session's cluster and again
after one more up/down cycle (run last, as k8s_cluster sorts it: it takes the cluster down)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once


def test_down_leaves_the_host_as_before_twice(
    cluster: Cluster,
) -> None:
    assert not cluster.reused, "never takes down a cluster the session did not bring up"
    for cycle in (1, 2):
        if cycle == 2:
            cluster.run_cluster("up")
        out = cluster.run_cluster("down")
        assert "the host is as before" in out, out
        assert cluster.host_differences() == [], f"after cycle {cycle}"
