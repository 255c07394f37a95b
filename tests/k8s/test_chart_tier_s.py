"""Tier S installed by the chart on the suite's cluster and serving (issue 28, point 3): the
migration hook completes, every pod becomes Ready, `helm test` passes, and the README's tour
passes through the cluster; the collector chart receives the services' OTLP and what it
exports holds none of the tour's canaries (EG15). Outputs are printed (read them with -rP)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from k8s_release import (
    COLLECTOR_CHART,
    COLLECTOR_IMAGE_VALUES,
    HELM,
    KUBECONFIG,
    Release,
    chat,
    tour,
)

from eventos.testing import wait_for_sync

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once

ROLES = ["ingress", "router", "relay", "workers-workflow", "egress", "llm"]
NAMESPACE = "eventos-tier-s"
TELEMETRY = "eventos-telemetry"
COLLECTOR = "eventos-collector"  # release and Service name
CHAT_CANARY = "canary-chat-K8s71"
NAME_LABEL = "kubernetes.io/metadata.name"
FORWARD_NOTE = re.compile(r"port-forward svc/(\S+) \d+:(\d+)")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(KUBECONFIG)}
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=900,
                          env=env, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def collector(cluster: Cluster) -> Iterator[str]:
    """The central collector, one replica, printing what it exports (the debug exporter at
    `detailed`), taking OTLP only from the tier S namespace (its NetworkPolicy)."""
    senders = [{"namespaceSelector": {"matchLabels": {NAME_LABEL: NAMESPACE}}}]
    try:
        yield from _installed_collector(senders)
    finally:
        helm("uninstall", COLLECTOR, "-n", TELEMETRY, "--wait")
        cluster.kubectl("delete", "namespace", TELEMETRY, "--ignore-not-found", "--wait=true",
                        "--timeout=300s")  # fmt: skip


def _installed_collector(senders: list[dict[str, object]]) -> Iterator[str]:
    done = helm(
        "install", COLLECTOR, str(COLLECTOR_CHART), "-n", TELEMETRY, "--create-namespace",
        "-f", str(COLLECTOR_IMAGE_VALUES), "--set", "replicas=1",
        "--set", "exporters.debug.verbosity=detailed", "--set", "resources.requests.cpu=10m",
        "--set", "networkPolicy.enabled=true", "--set-json", f"networkPolicy.from={json.dumps(senders)}",
        "--wait", "--timeout", "5m",
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}{done.stderr}"
    yield f"http://{COLLECTOR}.{TELEMETRY}.svc:4317"


@pytest.fixture(scope="module")
def tier_s(cluster: Cluster, collector: str) -> Iterator[Release]:
    release = Release(cluster, "acme", NAMESPACE, "S")
    # The suite's namespace stands in for an Ingress controller's (ingress.networkPolicy.httpFrom).
    outside = [{"namespaceSelector": {"matchLabels": {NAME_LABEL: cluster.namespace}}}]
    # The collector is in the cluster, a private address the egress policy lets through only
    # when the operator lists it (networkPolicy.egress.to).
    to_collector = [{"to": [{"namespaceSelector": {"matchLabels": {NAME_LABEL: TELEMETRY}}}]}]
    try:
        out = release.install(f"telemetry.otlpEndpoint={collector}", "temporal.dev.ui=true",
                               "defaults.env.OTEL_METRIC_EXPORT_INTERVAL=5000",
                               ingress__networkPolicy__httpFrom=outside,
                               networkPolicy__egress__to=to_collector)  # fmt: skip
        print(f"helm install (tier S): {release.install_s:.0f} s\n{out[-2500:]}")
        yield release
    finally:
        release.uninstall()


def test_every_pod_is_ready_and_the_migration_ran(tier_s: Release) -> None:
    print(tier_s.pod_table())
    pods = tier_s.pods()
    components = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
    assert components >= {*ROLES, "temporal", "postgresql"}
    assert tier_s.not_ready() == []
    # The migration Job is a post-install hook deleted once it succeeded: the release is
    # deployed only if it did, and the tour below reads the migrated tables.
    status = tier_s.helm("status", tier_s.name, "-o", "json")
    assert '"status":"deployed"' in status.stdout.replace(" ", ""), status.stdout


def test_helm_test_asks_every_service(tier_s: Release) -> None:
    out = tier_s.helm_test()
    print(out)
    assert "9 of 9 ready" in out


def test_the_notes_port_forwards_reach_the_console_and_the_temporal_ui(tier_s: Release) -> None:
    """What NOTES.txt tells the user to run: each port-forward it prints answers (the owner
    API's console, the dev server's Web UI), with the admin token from the Secret it names."""
    forwards = {name: int(port) for name, port in FORWARD_NOTE.findall(tier_s.notes)}
    assert set(forwards) == {f"{tier_s.prefix}-ingress", f"{tier_s.prefix}-temporal"}, tier_s.notes
    assert f"get secret {tier_s.name}-admin" in tier_s.notes
    for service, port in forwards.items():
        path = "/console" if service.endswith("-ingress") else "/"
        with tier_s.forward(service.removeprefix(f"{tier_s.prefix}-"), port) as local:
            page = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", f"http://127.0.0.1:{local}{path}"],
                                  capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        body, _, code = page.stdout.rpartition("\n")
        print(f"NOTES' port-forward to {service}:{port}{path} -> {code}, {len(body)} bytes")
        assert code == "200" and "<html" in body.lower(), page.stdout[-500:]


def test_the_tour_passes_through_the_cluster(tier_s: Release) -> None:
    print(tour(tier_s, chat=f"hi from the cluster {CHAT_CANARY}"))


def test_the_collector_receives_every_service_and_exports_no_canary(
    tier_s: Release, cluster: Cluster
) -> None:
    """EG15 on what the cluster's collector exports: every service's metrics arrive (their
    service.name in the export), and neither the tour's chat text nor the admin token is in it."""
    chat(tier_s, f"once more {CHAT_CANARY}")  # content to leak, whatever ran before
    names = {f"eventos-{role}" for role in ROLES}

    def exported() -> str:
        log = cluster.kubectl("logs", "-n", TELEMETRY, f"deployment/{COLLECTOR}", "--tail=-1")
        return log if all(f"Str({name})" in log for name in names) else ""

    log = wait_for_sync(exported, timeout=180, interval=5,
                        what="every service's metrics in the collector's export")  # fmt: skip
    print(f"collector export: {len(log.splitlines())} lines, services: {sorted(names)}")
    for canary in (CHAT_CANARY, tier_s.admin_token):
        assert canary not in log, f"{canary!r} left the instance"


@dataclass(frozen=True)
class Path:
    """One network path the chart's NetworkPolicies decide: from a pod to a Service's port."""

    source: str  # "outside" (the Ingress controller's stand-in), "stranger", or a role's pod
    target: str  # a component of the release, or LISTENER (a pod outside it)
    port: str  # the Service's port name
    open: bool  # what the policies should do


LISTENER = "listener"  # a probe pod serving HTTP on LISTENER_PORT in the suite's namespace
LISTENER_PORT = 8080
PATHS = [
    Path("outside", "ingress", "http", True),
    Path("outside", "ingress", "grpc", False),
    Path("outside", "postgresql", "postgresql", False),
    Path("outside", "temporal", "grpc", False),
    Path("outside", "relay", "grpc", False),
    Path("outside", "router", "metrics", False),
    Path("stranger", "ingress", "http", True),
    Path("stranger", "router", "metrics", True),
    Path("stranger", "postgresql", "postgresql", False),
    Path("stranger", "temporal", "grpc", False),
    Path("stranger", "relay", "grpc", False),
    Path("relay", "temporal", "grpc", True),
    Path("workers-workflow", "temporal", "grpc", True),
    Path("workers-workflow", "postgresql", "postgresql", True),
    Path("llm", "temporal", "grpc", True),
    Path("ingress", "postgresql", "postgresql", True),
    Path("egress", "postgresql", "postgresql", True),
    # The egress policy (issue 25 point 5): the roles that call out reach no private address
    # outside the release (the listener is a pod of the suite's namespace); the others do.
    Path("workers-workflow", LISTENER, "http", False),
    Path("llm", LISTENER, "http", False),
    Path("egress", LISTENER, "http", False),
    Path("ingress", LISTENER, "http", False),
    Path("router", LISTENER, "http", True),
    Path("relay", LISTENER, "http", True),
]
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)"
DENIED_WITHIN_S = 3  # a closed path: no connection in this long
OPEN_WITHIN_S = 60  # an open one from a new pod: kube-router lets it through a moment after start


def test_the_charts_network_policies_are_enforced(tier_s: Release, cluster: Cluster) -> None:
    """Point 5: each path the chart's policies close is closed and each one the instance needs
    is open (kube-router enforces them). Sources: a pod of the suite's namespace (allowed by
    ingress.networkPolicy.httpFrom, as an Ingress controller would be), a pod of the release's
    namespace that is not the release's, and the release's own pods (python in their image)."""
    strangers = {"outside": cluster.namespace, "stranger": tier_s.namespace}
    for name, namespace in strangers.items():
        pod = cluster.probe_pod(f"policy-{name}", ["log", "up"], labels={"app": f"policy-{name}"})
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    listener = cluster.probe_pod(f"policy-{LISTENER}", ["serve", str(LISTENER_PORT)],
                                 labels={"app": f"policy-{LISTENER}"})  # fmt: skip
    cluster.kubectl("apply", "-n", cluster.namespace, "-f", "-", input=json.dumps(listener))
    for name, namespace in [*strangers.items(), (LISTENER, cluster.namespace)]:
        cluster.kubectl("wait", "-n", namespace, f"pod/policy-{name}", "--for=condition=Ready",
                        "--timeout=90s")  # fmt: skip
    listener_ip = cluster.kubectl("get", "-n", cluster.namespace, f"pod/policy-{LISTENER}",
                                  "-o", "jsonpath={.status.podIP}").strip()  # fmt: skip
    ports = {svc["metadata"]["labels"]["app.kubernetes.io/component"]:
             {p["name"]: p["port"] for p in svc["spec"]["ports"]}
             for svc in json.loads(tier_s.kubectl("get", "services", "-o", "json"))["items"]}  # fmt: skip
    rows, wrong = [], []
    # Open paths first: they also show each source pod's network is up before a closed path
    # is believed closed.
    for path in sorted(PATHS, key=lambda p: not p.open):
        if path.target == LISTENER:
            address, port = listener_ip, LISTENER_PORT
        else:
            address = f"{tier_s.prefix}-{path.target}.{tier_s.namespace}.svc"
            port = ports[path.target][path.port]
        within = OPEN_WITHIN_S if path.open else DENIED_WITHIN_S
        if path.source in strangers:
            argv = ["exec", "-n", strangers[path.source], f"policy-{path.source}", "--",
                    "/probe", "connect", f"{address}:{port}", str(within)]  # fmt: skip
        else:
            argv = ["exec", "-n", tier_s.namespace, f"deployment/{tier_s.prefix}-{path.source}",
                    "--", "python", "-c", CONNECT, address, str(port)]  # fmt: skip
        code, said = cluster.attempt(*argv)
        connected = code == 0
        observed = "open" if connected else "closed"
        rows.append(f"{path.source:<17} {path.target + ':' + path.port:<22} "
                    f"{'open' if path.open else 'closed':<8} {observed}")  # fmt: skip
        if connected != path.open:
            wrong.append(f"{path}: {said.strip()}")
    for name, namespace in [*strangers.items(), (LISTENER, cluster.namespace)]:
        cluster.kubectl("delete", "pod", "-n", namespace, f"policy-{name}", "--wait=false")
    print("\n".join([f"{'from':<17} {'to':<22} {'expected':<8} observed", *rows]))
    assert wrong == []
