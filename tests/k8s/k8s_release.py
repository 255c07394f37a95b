"""An Event OS release on the suite's cluster: its Secrets, `helm install` with the locally built
images, `helm test`, a port-forward to a Service, and the README's tour through it.

A release installs as a user would (docs/deploy.md): the Secrets first, then the chart with a tier's
values file, `.eventos/images/values-eventos.yaml` (the images `make images` built and the cluster
loaded) and values-single-node.yaml (token CPU requests: one node of 2 cores).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k8s_cluster import KUBECTL, STATE

from eventos.testing import wait_for_sync

if TYPE_CHECKING:
    from k8s_cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "eventos"
HELM = REPO / ".tools" / "bin" / "helm"
IMAGE_VALUES = REPO / ".eventos" / "images" / "values-eventos.yaml"
COLLECTOR_CHART = REPO / "deploy" / "helm" / "eventos-collector"
COLLECTOR_IMAGE_VALUES = REPO / ".eventos" / "images" / "values-eventos-collector.yaml"
SINGLE_NODE = Path(__file__).resolve().parent / "values-single-node.yaml"
EVENTOSCTL = REPO / ".venv" / "bin" / "eventosctl"
EXAMPLE = REPO / "examples" / "hello.yaml"
KUBECONFIG = STATE / "kubeconfig"
INSTALL_TIMEOUT = "15m"
JOBS_TIMEOUT_S = 180
# Tier L's 18 service pods (a pool of up to 10 each) and its Temporal server (two pools of 40):
# PostgreSQL's default 100 refuses some ("too many clients already"); the chart's bundled
# server has the same setting (postgresql.bundled.maxConnections).
MAX_CONNECTIONS = 400
FORWARD_RE = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) ->")


@dataclass
class Release:
    """One installed release of the instance chart, in its own namespace."""

    cluster: Cluster
    name: str
    namespace: str
    tier: str
    install_s: float = 0.0
    admin_token: str = field(default="", repr=False)
    # An external PostgreSQL (external_postgresql) instead of the chart's bundled one.
    database: ExternalDatabase | None = None
    notes: str = ""  # what `helm install` printed under NOTES

    @property
    def prefix(self) -> str:
        return f"{self.name}-eventos"

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return self.cluster.kubectl("-n", self.namespace, *args, check=check, input=input)

    def helm(self, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(KUBECONFIG)}
        return subprocess.run([str(HELM), *args, "-n", self.namespace], capture_output=True,
                              text=True, timeout=timeout, env=env, check=False)  # fmt: skip

    def create_secrets(self) -> None:
        """The Secrets docs/deploy.md has users create before the install."""
        pg_password = self.database.password if self.database else secrets.token_hex(16)
        self.admin_token = secrets.token_hex(24)
        host = self.database.host if self.database else f"{self.prefix}-postgresql"
        url = f"postgresql://postgres:{pg_password}@{host}:5432/eventos"
        outbox = f"k1:{base64.b64encode(secrets.token_bytes(32)).decode()}"
        for name, key, value in [
            ("postgresql", "password", pg_password),
            ("database", "url", url),
            ("admin", "token", self.admin_token),
            ("internal", "token", secrets.token_hex(24)),
            ("outbox", "keys", outbox),
        ]:
            self.kubectl("create", "secret", "generic", f"{self.name}-{name}",
                         f"--from-literal={key}={value}")  # fmt: skip

    def install(
        self, *sets: str, values: Sequence[Path] = (),
        employee_secrets: Mapping[str, str] | None = None, **json_sets: Any,
    ) -> str:  # fmt: skip
        """`helm install --wait` with the tier's values, the images and the Secrets; `values`
        files go last, `employee_secrets` (reference → value) become the employees' Secret;
        `sets` as --set, `json_sets` (dotted keys spelled with __) as --set-json. Fails unless
        it succeeded; then waits for the release's Jobs (`helm install --wait` returns once the
        Deployments are Ready, and the Temporal namespace Job may still be registering search
        attributes) and keeps the NOTES. Returns what helm printed."""
        self.cluster.kubectl("create", "namespace", self.namespace)
        self.create_secrets()
        keys = ["database", "admin", "internal", "outbox"]
        if employee_secrets is not None:
            literals = [f"--from-literal={k}={v}" for k, v in employee_secrets.items()]
            self.kubectl("create", "secret", "generic", f"{self.name}-employees", *literals)
            keys.append("employees")
        tier_values = [f"values-tier-{self.tier.lower()}.yaml"]
        args = ["install", self.name, str(CHART), "--wait", "--timeout", INSTALL_TIMEOUT]
        for path in [CHART / v for v in tier_values] + [IMAGE_VALUES, SINGLE_NODE, *values]:
            args += ["-f", str(path)]
        for key in keys:
            args += ["--set", f"secrets.{key}.existingSecret={self.name}-{key}"]
        args += ["--set", f"instance.id=inst-{self.tier.lower()}-k8s-tests"]
        if self.database is None:
            args += ["--set", "postgresql.bundled.enabled=true",
                     "--set", f"postgresql.existingSecret={self.name}-postgresql"]  # fmt: skip
        elif self.tier == "L":  # Temporal's two databases on the same server, made by its Job
            args += ["--set", f"temporal.server.sql.host={self.database.host}",
                     "--set", "temporal.server.sql.user=postgres",
                     "--set", f"temporal.server.sql.existingSecret={self.name}-postgresql"]  # fmt: skip
        for s in sets:
            args += ["--set", s]
        if self.database is not None:  # its own namespace: a private address the roles need
            db_namespace = self.database.host.split(".")[1]
            json_sets.setdefault("networkPolicy__egress__to", [{"to": [{"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": db_namespace}}}]}])  # fmt: skip
        for key, value in json_sets.items():
            args += ["--set-json", f"{key.replace('__', '.')}={json.dumps(value)}"]
        started = time.monotonic()
        done = self.helm(*args)
        self.install_s = time.monotonic() - started
        assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{self.pod_table()}"
        self.notes = done.stdout.partition("NOTES:\n")[2]
        self.kubectl("wait", "--for=condition=complete", "job", "--all",
                     f"--timeout={JOBS_TIMEOUT_S}s")  # fmt: skip
        return done.stdout

    def helm_test(self) -> str:
        """`helm test --logs`: the readiness pod's lines; fails unless every target was ready."""
        done = self.helm("test", self.name, "--logs", "--timeout", "5m")
        assert done.returncode == 0, f"{done.stdout}{done.stderr}"
        return done.stdout

    def image(self, name: str) -> str:
        """The reference of one of the images `make images` built (images.json)."""
        listed: dict[str, str] = json.loads((IMAGE_VALUES.parent / "images.json").read_text())
        (ref,) = [r for r in listed if r.split(":")[0] == f"eventos/{name}"]
        return ref

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(self.kubectl("get", "pods", "-o", "json"))["items"]
        return items

    def not_ready(self) -> list[str]:
        """Pods that are not Ready (a Job's pod: that did not complete), with their status."""
        found = []
        for pod in self.pods():
            owners = {o["kind"] for o in pod["metadata"].get("ownerReferences", [])}
            statuses = pod["status"].get("containerStatuses", [])
            if "Job" in owners:
                ok = all(s["state"].get("terminated", {}).get("exitCode") == 0 for s in statuses)
            else:
                conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
                ok = conditions.get("Ready") == "True"
            if not ok:
                found.append(f"{pod['metadata']['name']}: {pod['status']}")
        return found

    def secret(self, name: str, key: str) -> str:
        """One value of one of the release's Secrets (`{release}-{name}`)."""
        encoded = self.kubectl("get", "secret", f"{self.name}-{name}",
                               "-o", f"jsonpath={{.data.{key}}}")  # fmt: skip
        return base64.b64decode(encoded).decode()

    def service_ip(self, service: str) -> str:
        """The ClusterIP of one of the release's Services."""
        return self.kubectl("get", "service", f"{self.prefix}-{service}",
                            "-o", "jsonpath={.spec.clusterIP}").strip()  # fmt: skip

    def pod_table(self) -> str:
        return self.kubectl("get", "pods", "-o", "wide")

    def uninstall(self) -> None:
        self.helm("uninstall", self.name, "--wait", "--timeout", "5m")
        self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=true",
                             "--timeout=300s", check=False)  # fmt: skip
        self.cluster.run_cluster("recycle")  # its claims went with the namespace

    @contextlib.contextmanager
    def forward(self, service: str, port: int) -> Iterator[int]:
        """`kubectl port-forward` to a Service of the release on a free loopback port."""
        argv = [str(KUBECTL), "--kubeconfig", str(KUBECONFIG), "-n", self.namespace, "port-forward", "--address", "127.0.0.1",
                f"svc/{self.prefix}-{service}", f":{port}"]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # kubectl says the port first, or why it cannot
            found = FORWARD_RE.search(line)
            assert found, f"port-forward to {service}: {line}{proc.stdout.read(2000)}"
            yield int(found.group(1))
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    def eventosctl(self, url: str, *args: str, timeout: float = 180, unless: str = "") -> str:
        """eventosctl on the release's owner API; fails unless it succeeded (or said `unless`)."""
        env = {**os.environ, "EVENTOS_URL": url, "EVENTOS_ADMIN_TOKEN": self.admin_token}
        done = subprocess.run([str(EVENTOSCTL), *args], capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)  # fmt: skip
        said = f"{done.stdout}{done.stderr}"
        assert done.returncode == 0 or (unless and unless in said), (
            f"eventosctl {' '.join(args)}: {said}"
        )
        return said if done.returncode else done.stdout


@dataclass(frozen=True)
class ExternalDatabase:
    """A PostgreSQL outside the release (what tier L expects): its host and superuser password."""

    host: str
    password: str = field(repr=False)


def external_postgresql(cluster: Cluster, namespace: str, image: str) -> ExternalDatabase:
    """PostgreSQL 16 (the image `make images` built) in its own namespace, data on an emptyDir:
    the instance's database server as a platform team would run it beside the release."""
    password = secrets.token_hex(16)
    labels = {"app.kubernetes.io/name": "postgresql"}
    pg_isready = {"exec": {"command": ["pg_isready", "-U", "postgres", "-h", "127.0.0.1"]},
                  "periodSeconds": 2, "failureThreshold": 60}  # fmt: skip
    container = {
        "name": "postgresql", "image": image, "imagePullPolicy": "Never",
        "args": ["-c", f"max_connections={MAX_CONNECTIONS}"],
        "env": [{"name": "POSTGRES_PASSWORD_FILE", "value": "/var/run/secrets/pg/password"},
                {"name": "POSTGRES_DB", "value": "eventos"},
                {"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"}],
        "ports": [{"name": "postgresql", "containerPort": 5432}],
        "startupProbe": pg_isready, "readinessProbe": pg_isready,
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"},
                         {"name": "password", "mountPath": "/var/run/secrets/pg"},
                         {"name": "run", "mountPath": "/var/run/postgresql"},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }  # fmt: skip
    objects = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "postgresql"},
         "stringData": {"password": password}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "postgresql"},
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                  "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "securityContext": {"runAsNonRoot": True, "runAsUser": 999,
                                          "runAsGroup": 999, "fsGroup": 999},
                      "containers": [container],
                      "volumes": [{"name": "data", "emptyDir": {}},
                                  {"name": "password", "secret": {"secretName": "postgresql",
                                                                  "defaultMode": 0o440}},
                                  {"name": "run", "emptyDir": {}},
                                  {"name": "tmp", "emptyDir": {}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "postgresql"},
         "spec": {"selector": labels, "ports": [{"name": "postgresql", "port": 5432}]}},
    ]  # fmt: skip
    cluster.kubectl("create", "namespace", namespace)
    items = {"apiVersion": "v1", "kind": "List", "items": objects}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(items))
    cluster.kubectl("rollout", "status", "-n", namespace, "deployment/postgresql", "--timeout=180s")
    return ExternalDatabase(f"postgresql.{namespace}.svc", password)


def tour(release: Release, chat: str = "hi from the cluster") -> str:
    """The README's tour through a port-forward to ingress: apply and start `hello`, the owner
    chats and is answered, a webhook becomes a turn on the timeline, the console answers.
    Returns what it printed, for the closing note."""
    lines: list[str] = []
    with release.forward("ingress", 8080) as port:
        url = f"http://127.0.0.1:{port}"

        def run(*args: str) -> str:
            out = release.eventosctl(url, *args)
            lines.append(f"$ eventosctl {' '.join(args)}\n{out}")
            return out

        run("apply", "-f", str(EXAMPLE))
        run("start", "hello", "--wait")
        answer = run("chat", "hello", chat, "--wait")
        assert f"[local] you said: {chat}" in answer
        hook = subprocess.run(
            ["curl", "-sS", "-X", "POST", "-H", "X-Event-Id: k8s-1", "-H",
             "Content-Type: application/json", "-d", '{"ping": 1}', f"{url}/hooks/hello"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        lines.append(f"$ curl -X POST … {url}/hooks/hello\n{hook.stdout}")
        assert json.loads(hook.stdout)["status"] == "accepted"

        def webhook_turn_done() -> str | None:
            out = release.eventosctl(url, "timeline", "hello")
            rows = out.splitlines()
            accepted = [i for i, r in enumerate(rows) if "webhook hello accepted" in r]
            done = [i for i, r in enumerate(rows) if "turn.done" in r]
            return out if accepted and done and done[-1] > accepted[-1] else None

        timeline = wait_for_sync(webhook_turn_done, timeout=120, interval=1,
                                 what="the webhook's turn done on the timeline")  # fmt: skip
        lines.append(f"$ eventosctl timeline hello\n{timeline}")
        console = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                                  f"{url}/console"], capture_output=True, text=True, timeout=60,
                                 check=True)  # fmt: skip
        lines.append(f"$ curl {url}/console -> {console.stdout}")
        assert console.stdout == "200"
    return "\n".join(lines)


def chat(release: Release, text: str) -> str:
    """The owner chats with `hello` (applied and started unless it runs) through a port-forward
    to ingress; the answer."""
    with release.forward("ingress", 8080) as port:
        url = f"http://127.0.0.1:{port}"
        release.eventosctl(url, "apply", "-f", str(EXAMPLE))
        release.eventosctl(url, "start", "hello", "--wait", unless="already has generation")
        answer = release.eventosctl(url, "chat", "hello", text, "--wait")
    assert f"[local] you said: {text}" in answer, answer
    return answer
