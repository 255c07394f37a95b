"""NetworkPolicies are enforced (kube-router's firewall): a denied path is closed, an allowed one open."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from eventos.testing import wait_for_sync

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once


def policy(name: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    """A policy on the `guarded` server's ingress."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name},
        "spec": {"podSelector": {"matchLabels": {"app": "guarded"}},
                 "policyTypes": ["Ingress"], "ingress": ingress},
    }  # fmt: skip


def reaches(cluster: Cluster, client: str, label: str, ip: str, within_s: int = 0) -> bool:
    """Whether a pod labelled `label` gets an HTTP answer from the guarded server (in time)."""
    url = f"http://{ip}:8080/"
    args = ["poll", url, str(within_s)] if within_s else ["get", url]
    pod = cluster.probe_pod(client, args, restart="Never", labels={"role": label})
    cluster.apply(pod)
    return cluster.wait_phase_in(client, ("Succeeded", "Failed")) == "Succeeded"


def test_a_policy_denies_what_it_does_not_allow(cluster: Cluster) -> None:
    cluster.apply(cluster.probe_pod("guarded", ["serve", "8080"]))
    cluster.wait_phase("guarded", "Running")
    ip = cluster.get("pod", "guarded")["status"]["podIP"]
    assert reaches(cluster, "before-policy", "stranger", ip)

    allowed = [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}]}]
    cluster.apply(policy("only-friends", allowed))
    wait_for_sync(
        lambda: not reaches_once(cluster, "stranger", ip),
        timeout=60,
        interval=0,
        what="the policy closes the stranger's path",
    )  # each attempt is a fresh pod
    # kube-router adds a new pod's address to the policy's source set within its sync.
    assert reaches(cluster, "friend", "friend", ip, within_s=30)
    assert not reaches(cluster, "stranger-last", "stranger", ip)


def reaches_once(cluster: Cluster, label: str, ip: str) -> bool:
    """One more attempt from a fresh pod (a policy takes effect within the firewall's sync)."""
    cluster.attempts += 1
    return reaches(cluster, f"{label}-{cluster.attempts}", label, ip)
