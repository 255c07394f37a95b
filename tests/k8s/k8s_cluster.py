"""The k8s suite's cluster and helpers: kubectl on it, pods of the probe image, waits.

Only `make test-k8s` runs the suite (`-m k8s`; pyproject's addopts deselect it otherwise). The
session brings a cluster up from empty folders (deploy/cluster/cluster.py) and takes it down at
its end; test_teardown_host, run last whatever the names of the other modules, takes it down
itself and checks the host twice.
Test modules load this module as a plugin (`pytest_plugins`), so the fixture exists once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eventos.testing import wait_for_sync

REPO = Path(__file__).resolve().parents[2]
CLUSTER = [sys.executable, str(REPO / "deploy" / "cluster" / "cluster.py")]
HOST = [sys.executable, str(REPO / "deploy" / "cluster" / "host.py")]
STATE = REPO / ".eventos" / "k8s"
KUBECTL = REPO / ".tools" / "k8s" / "v1.34.4" / "bin" / "kubectl"
PROBE_IMAGE = "localhost/eventos/k8s-probe:1"
PROBE_ARCHIVE = REPO / ".tools" / "k8s" / "images" / "probe.tar"
KUBECONFIG = STATE / "kubeconfig"


def host_snapshot() -> dict[str, Any]:
    """What the cluster may change on the host (deploy/cluster/host.py snapshot)."""
    out = subprocess.run([*HOST, "snapshot"], capture_output=True, text=True, check=True)
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def host_differences(before: dict[str, Any]) -> list[str]:
    """What differs on the host now from `before` (one line each)."""
    result = subprocess.run([*HOST, "compare", "-"], input=json.dumps(before),
                            capture_output=True, text=True)  # fmt: skip
    return [line for line in result.stdout.splitlines() if line]


class Cluster:
    """The session's cluster, seen through kubectl in the test namespace."""

    namespace = "k8s-tests"

    def __init__(self, host_before: dict[str, Any]) -> None:
        self.host_before = host_before  # the host before the session's cluster came up
        self.attempts = 0  # a counter for unique pod names
        self.reused = False  # a cluster `make cluster` keeps up (EVENTOS_K8S_REUSE=1)

    def wait_phase_in(self, pod: str, phases: tuple[str, ...], timeout_s: float = 90) -> str:
        """Wait until the pod reaches one of these phases; return it."""

        def phase() -> str | None:
            found = self.get("pod", pod).get("status", {}).get("phase")
            return str(found) if found in phases else None

        return str(wait_for_sync(phase, timeout=timeout_s, interval=0.5,
                             what=f"pod {pod} in one of the phases {phases}"))  # fmt: skip

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """kubectl on the admin kubeconfig; fails the test with kubectl's message."""
        argv = [str(KUBECTL), "--kubeconfig", str(KUBECONFIG), *args]
        result = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=180)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def attempt(self, *args: str, timeout: float = 180) -> tuple[int, str]:
        """kubectl whose failure is an answer: its exit code and everything it printed."""
        argv = [str(KUBECTL), "--kubeconfig", str(KUBECONFIG), *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return result.returncode, result.stdout + result.stderr

    def run_cluster(self, *args: str) -> str:
        """deploy/cluster/cluster.py with these arguments."""
        result = subprocess.run([*CLUSTER, *args], capture_output=True, text=True)
        if result.returncode != 0:
            raise AssertionError(f"cluster.py {' '.join(args)}: {result.stdout}{result.stderr}")
        return result.stdout

    def is_up(self) -> bool:
        """Whether a cluster from here has not been taken down."""
        return (STATE / "host-before.json").exists()

    def apply(self, *objects: dict[str, Any]) -> None:
        """kubectl apply in the test namespace."""
        items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        self.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(items))

    def wait_phase(self, pod: str, phase: str, timeout_s: int = 90) -> None:
        """Wait until the pod is in this phase (kubectl wait, with a deadline)."""
        self.kubectl("wait", "-n", self.namespace, f"pod/{pod}",
                     f"--for=jsonpath={{.status.phase}}={phase}", f"--timeout={timeout_s}s")  # fmt: skip

    def wait_json(
        self, path: str, timeout_s: float, until: Callable[[Any], bool] = lambda _: True
    ) -> Any:
        """GET an API path until it answers and `until` holds; past the deadline, fail."""

        def answer() -> list[Any]:
            out = self.kubectl("get", "--raw", path, check=False)
            data = json.loads(out) if out else None
            return [data] if out and until(data) else []  # a one-item list: falsy only if none

        return wait_for_sync(answer, timeout=timeout_s, interval=1, what=f"GET {path}")[0]

    def logs(self, pod: str) -> str:
        """The pod's log."""
        return self.kubectl("logs", "-n", self.namespace, pod)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        """One object as JSON."""
        data: dict[str, Any] = json.loads(
            self.kubectl("get", "-n", self.namespace, kind, name, "-o", "json")
        )
        return data

    def probe_pod(self, name: str, args: list[str], restart: str = "Always", **spec: Any) -> Any:
        """A pod of the probe image (see probe_pod)."""
        return probe_pod(name, args, restart, **spec)

    def get_in(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        """One object of another namespace (or, with "", a cluster-scoped one) as JSON."""
        scope = ["-n", namespace] if namespace else []
        data: dict[str, Any] = json.loads(self.kubectl("get", *scope, kind, name, "-o", "json"))
        return data

    def host_differences(self) -> list[str]:
        """What differs on the host now from before the session's cluster."""
        return host_differences(self.host_before)

    def run_probe(self, name: str, *args: str, **spec: Any) -> str:
        """Run the probe once with these arguments in a pod; its log once it succeeded."""
        self.apply(probe_pod(name, list(args), restart="Never", **spec))
        self.wait_phase(name, "Succeeded")
        return self.logs(name)


def probe_pod(name: str, args: list[str], restart: str = "Always", **spec: Any) -> dict[str, Any]:
    """A pod of the probe image (loaded into containerd, never pulled)."""
    container: dict[str, Any] = {"name": "probe", "image": PROBE_IMAGE,
                                 "imagePullPolicy": "Never", "args": args}  # fmt: skip
    if "volume_mounts" in spec:
        container["volumeMounts"] = spec.pop("volume_mounts")
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
        "spec": {"restartPolicy": restart, "containers": [container],
                 "terminationGracePeriodSeconds": 1, **spec},
    }  # fmt: skip


TEARDOWN_MODULE = "test_teardown_host.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The teardown check runs last: it takes the session's cluster down."""
    items.sort(key=lambda item: item.path.name == TEARDOWN_MODULE)  # stable: keeps the rest


REUSE_VAR = "EVENTOS_K8S_REUSE"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A cluster brought up for the session with the probe image loaded; down at the end.

    With EVENTOS_K8S_REUSE=1 the session uses the cluster `make cluster` keeps up and leaves it
    up (for working on one module: `EVENTOS_K8S_REUSE=1 pytest -m k8s -p no:xdist tests/k8s/X`);
    the teardown check refuses to run then.
    """
    if os.environ.get(REUSE_VAR) == "1":
        if not (STATE / "host-before.json").exists():
            pytest.fail(f"{REUSE_VAR}=1 but no cluster is up: run `make cluster` first")
        session = Cluster(json.loads((STATE / "host-before.json").read_text()))
        session.reused = True
        session.run_cluster("import", PROBE_IMAGE, str(PROBE_ARCHIVE))
        session.kubectl("create", "namespace", session.namespace, check=False)
        yield session
        return
    host_before = host_snapshot()
    up = subprocess.run([*CLUSTER, "up"], capture_output=True, text=True)
    print(up.stdout)
    if up.returncode != 0:
        subprocess.run([*CLUSTER, "down"], capture_output=True)
        pytest.fail(f"cluster up failed: {up.stdout}{up.stderr}")
    session = Cluster(host_before)
    session.run_cluster("import", PROBE_IMAGE, str(PROBE_ARCHIVE))
    session.kubectl("create", "namespace", session.namespace)
    yield session
    if session.is_up():
        down = subprocess.run([*CLUSTER, "down"], capture_output=True, text=True)
        print(down.stdout, down.stderr)
