"""Tier S installed by the chart on the suite's cluster and serving (issue 28, point 3): the
migration hook completes, every pod becomes Ready, `helm test` passes, and the README's tour
passes through the cluster. Its output is printed (`make test-k8s` runs pytest with -s off:
read it with -rP or in the closing note)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from k8s_release import Release, tour

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once

ROLES = ["ingress", "router", "relay", "workers-workflow", "egress", "llm"]


@pytest.fixture(scope="module")
def tier_s(cluster: Cluster) -> Iterator[Release]:
    release = Release(cluster, "acme", "eventos-tier-s", "S")
    done = release.install()
    print(f"helm install (tier S): {release.install_s:.0f} s\n{done.stdout[-1500:]}")
    assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{release.pod_table()}"
    yield release
    release.uninstall()


def test_every_pod_is_ready_and_the_migration_ran(tier_s: Release) -> None:
    print(tier_s.pod_table())
    pods = tier_s.pods()
    components = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
    assert components >= {*ROLES, "temporal", "postgresql"}
    for pod in pods:
        name = pod["metadata"]["name"]
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        assert conditions.get("Ready") == "True", f"{name} is not Ready: {pod['status']}"
    # The migration Job is a post-install hook deleted once it succeeded: the release is
    # deployed only if it did, and the tour below reads the migrated tables.
    status = tier_s.helm("status", tier_s.name, "-o", "json")
    assert '"status":"deployed"' in status.stdout.replace(" ", ""), status.stdout


def test_helm_test_asks_every_service(tier_s: Release) -> None:
    done = tier_s.helm("test", tier_s.name, "--logs", "--timeout", "5m")
    print(done.stdout)
    assert done.returncode == 0, f"{done.stdout}{done.stderr}"
    assert "9 of 9 ready" in done.stdout


def test_the_tour_passes_through_the_cluster(tier_s: Release) -> None:
    print(tour(tier_s))
