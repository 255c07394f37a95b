"""The fault run's target on the cluster (issue 28, point 6): a release's pods deleted with no
grace (`kubectl delete pod --grace-period=0 --force`), and whether the release is whole again.

It is bench/faults_schedule.py's FaultTarget, as bench/faults_instance.py's Instance is for the
local instance: a kill deletes every pod of a role, a loss deletes the server's pod; the
Deployment or StatefulSet makes a new one, which the next fault waits for (Ready). A forced
deletion takes the pod out of the API at once; the kubelet then stops its containers (SIGTERM,
SIGKILL two seconds later: the kubelet's floor for a zero grace period). So a pod counts as gone
once its address stops taking connections on its port, seen from the host (the bridge routes
the pod range to it; kube-router lets the node reach its pods).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from eventos import names
from eventos.testing import wait_for_sync

if TYPE_CHECKING:
    from k8s_release import Release

POSTGRES, TEMPORAL = "postgres", "temporal"  # bench/faults_instance.py's names of the servers
# A target's component label, where it is not its name (tier S: one LLM Deployment, `llm`).
COMPONENTS = {"workers-llm": "llm", POSTGRES: "postgresql", TEMPORAL: "temporal"}
WHOLE = (*names.SERVICES, TEMPORAL, POSTGRES)  # each has a Ready pod when the release is whole
GONE_S = 60.0  # a deleted pod's containers are stopped by then
BACK_S = 300.0  # a deleted server's new pod has started by then
CONNECT_S = 0.5
# The bundled server's log line once it takes sessions again (its log_timezone is UTC).
PG_READY = re.compile(
    r"^(\S+ \S+) UTC \[1\] LOG:  database system is ready to accept connections", re.MULTILINE
)


def component(target: str) -> str:
    """The component label of a target (a service role, `postgres` or `temporal`)."""
    return COMPONENTS.get(target, target)


@dataclass
class ClusterTarget:
    """A tier S release's pods, deleted one role at a time."""

    release: Release
    say: Callable[[str], None] = print

    def kill(self, target: str, down: Callable[..., None]) -> None:
        """Delete every pod of the role; `down` once none takes connections any more."""
        pods = self._pods(component(target))
        self._delete(pods)
        down(self._gone(pods))

    def lose_postgres(self, seconds: float, down: Callable[..., None],
                      up: Callable[..., None]) -> None:  # fmt: skip
        """Delete PostgreSQL's pod (its StatefulSet makes it again on the same volume: crash
        recovery); `up` with the moment the new server took sessions again. `seconds` is not
        used: the outage lasts as long as the new pod takes."""
        self._lose(POSTGRES, down, up)

    def lose_temporal(self, seconds: float, down: Callable[..., None],
                      up: Callable[..., None]) -> None:  # fmt: skip
        """Delete the Temporal server's pod (tier S: the dev server on its volume)."""
        self._lose(TEMPORAL, down, up)

    def ready(self) -> bool:
        return not self.not_ready()

    def not_ready(self) -> list[str]:
        """The targets with no Ready pod that is not being deleted."""
        ready = {
            p["metadata"]["labels"].get("app.kubernetes.io/component")
            for p in self._all_pods()
            if _ready(p) and not p["metadata"].get("deletionTimestamp")
        }
        return [t for t in WHOLE if component(t) not in ready]

    def revive(self) -> None:
        """Nothing to do: the cluster restarts what exits."""

    def logs(self, target: str) -> str:
        """The log of the role's pods as they are now (a deleted pod's log went with it)."""
        return self.release.kubectl("logs", "-l", _selector(self.release, component(target)),
                                    "--tail=-1", "--max-log-requests=10", check=False)  # fmt: skip

    def _lose(self, target: str, down: Callable[..., None], up: Callable[..., None]) -> None:
        (old,) = self._pods(component(target))
        # Its moment of death is read from the host: the host must reach it while it lives.
        assert _connects(old["status"]["podIP"], _first_port(old)), f"{target} unreachable"
        self._delete([old])
        down(self._gone([old]))
        new = self._replaced(component(target), old["metadata"]["uid"])
        up(self._postgres_ready(new) if target == POSTGRES else self._container_started(new))

    def _all_pods(self) -> list[dict[str, Any]]:
        out = self.release.kubectl("get", "pods", "-l",
                                   f"app.kubernetes.io/instance={self.release.name}", "-o", "json")  # fmt: skip
        pods: list[dict[str, Any]] = json.loads(out)["items"]
        return [p for p in pods if not _owned_by_job(p)]

    def _pods_of(self, label: str) -> list[dict[str, Any]]:
        return [p for p in self._all_pods()
                if p["metadata"]["labels"].get("app.kubernetes.io/component") == label]  # fmt: skip

    def _pods(self, label: str) -> list[dict[str, Any]]:
        """The pods of one component (one at least)."""
        pods = self._pods_of(label)
        assert pods, f"no pod of {label}: {self.release.pod_table()}"
        return pods

    def _delete(self, pods: list[dict[str, Any]]) -> None:
        names_ = [p["metadata"]["name"] for p in pods]
        self.release.kubectl("delete", "pod", *names_, "--grace-period=0", "--force",
                             "--wait=false")  # fmt: skip

    def _gone(self, pods: list[dict[str, Any]]) -> float:
        """The moment no deleted pod took connections on its first port any more: when the
        first round of attempts that all failed began (an attempt to an address whose pod is
        gone waits out its timeout: the end of the round is late)."""
        addresses = [(p["status"]["podIP"], _first_port(p)) for p in pods]

        def gone_since() -> float | None:
            began = time.time()
            return None if any(_connects(*a) for a in addresses) else began

        at = wait_for_sync(gone_since, timeout=GONE_S, interval=0.1,
                           what=f"deleted pods {addresses} stop taking connections")  # fmt: skip
        assert at is not None  # wait_for_sync returns only what holds
        return at

    def _replaced(self, label: str, old_uid: str) -> str:
        """The name of the pod that replaced `old_uid`, once its container runs."""

        def running() -> str | None:
            for pod in self._pods_of(label):
                if pod["metadata"]["uid"] == old_uid:
                    continue  # the deleted pod, still listed for a moment
                if any("running" in s.get("state", {})
                       for s in pod["status"].get("containerStatuses", [])):  # fmt: skip
                    return str(pod["metadata"]["name"])
            return None

        name = wait_for_sync(running, timeout=BACK_S, interval=0.5, what=f"a new {label} pod")
        assert name is not None  # wait_for_sync returns only what holds
        return name

    def _container_started(self, pod: str) -> float:
        """When the pod's container started (the kubelet's clock, this machine's; whole seconds,
        rounded down)."""
        status = json.loads(self.release.kubectl("get", "pod", pod, "-o", "json"))["status"]
        started = status["containerStatuses"][0]["state"]["running"]["startedAt"]
        return datetime.fromisoformat(started).timestamp()

    def _postgres_ready(self, pod: str) -> float:
        """When the new server took sessions again (after its crash recovery), from its log: no
        commit can happen before. (Its container's start says nothing: the entrypoint first
        waits for the old server to exit.)"""

        def ready() -> float | None:
            log = self.release.kubectl("logs", pod, check=False)
            found = PG_READY.search(log)
            return datetime.fromisoformat(found.group(1) + "+00:00").timestamp() if found else None

        at = wait_for_sync(ready, timeout=BACK_S, interval=0.5, what=f"{pod}: server ready")
        assert at is not None  # wait_for_sync returns only what holds
        return at


def _selector(release: Release, label: str) -> str:
    return f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component={label}"


def _owned_by_job(pod: dict[str, Any]) -> bool:
    return any(o["kind"] == "Job" for o in pod["metadata"].get("ownerReferences", []))


def _ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return conditions.get("Ready") == "True"


def _first_port(pod: dict[str, Any]) -> int:
    return int(pod["spec"]["containers"][0]["ports"][0]["containerPort"])


def _connects(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), CONNECT_S):
        return True
    return False


@contextlib.contextmanager
def database_url(release: Release) -> Iterator[str]:
    """The release's database from the host, through a port-forward to its PostgreSQL Service
    (opened once the faults are done: a forward dies with the pod it bound to)."""
    password = release.secret("postgresql", "password")
    with release.forward("postgresql", 5432) as port:
        yield f"postgresql://postgres:{password}@127.0.0.1:{port}/eventos"
