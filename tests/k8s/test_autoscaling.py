"""KEDA scales a tier L class worker on its queue's backlog, out under load and back in.

The chart installed at tier L with `autoscaling.keda.enabled` (its bundled PostgreSQL, the
Temporal server with its schema and namespace Jobs, the four class Deployments and their
ScaledObjects; the other roles at 0 replicas, since only the LLM workers take part) on a cluster
with KEDA (`cluster.py keda`). The load is real LLM steps: `llm_step` activities on `llm-c1`,
started by a workflow this test runs through a port-forward, each run by the chart's llm-c1
pods on the local model, which sleeps as the step's script says. One slot per pod keeps the
workers few and slow, so the queue's backlog grows; KEDA's Temporal scaler reads it from the
frontend and its HPA adds pods; once the steps are done the backlog is gone and the HPA goes
back to minReplicas after the (lowered) scale-down stabilization window.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from k8s_cluster import KUBECTL, REPO, STATE
from temporalio import workflow
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

from eventos import names
from eventos.contracts import ChatMessage, LlmStepInput, LlmStepOutput, ModelRef
from eventos.runtime.payload_guard import connect
from eventos.testing import wait_for

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once

HELM = REPO / ".tools" / "bin" / "helm"
CHART = REPO / "deploy" / "helm" / "eventos"
IMAGES_JSON = REPO / ".eventos" / "images" / "images.json"
NAMESPACE = "eventos-keda-test"
RELEASE = "kt"
DEPLOYMENT = f"{RELEASE}-eventos-llm-c1"
HPA = f"keda-hpa-{DEPLOYMENT}"  # the HPA KEDA makes for the ScaledObject of the same name
TEMPORAL_SERVICE = f"{RELEASE}-eventos-temporal"
TEMPORAL_NAMESPACE = "default"
LOAD_QUEUE = "keda-backlog-load"  # the test's own workflow queue; the steps go to llm-c1
QUEUE = names.LLM_QUEUES[1]
STEPS = 40
STEP_SLEEP_S = 4
MIN_REPLICAS, MAX_REPLICAS, TARGET_BACKLOG = 1, 4, 2
STABILIZATION_S = 20
POLL_S = 2.0
PG_PASSWORD = "keda-test-pg"  # the bundled PostgreSQL of a throwaway namespace


def kubectl(*args: str, check: bool = True) -> str:
    """kubectl in the test namespace."""
    argv = [str(KUBECTL), "--kubeconfig", str(STATE / "kubeconfig"), "-n", NAMESPACE, *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def image(name: str) -> tuple[str, str]:
    """(repository prefix, tag) of `eventos/<name>` as `make images` listed it."""
    listed = json.loads(IMAGES_JSON.read_text())
    (ref,) = [ref for ref in listed if ref.rsplit(":", 1)[0].endswith(f"/{name}")]
    repository, tag = ref.rsplit(":", 1)
    return repository.rsplit("/", 1)[0], tag


def values() -> dict[str, Any]:
    """Tier L with KEDA on this one-node cluster: small requests, llm-c1 with one slot a pod."""
    repository, tag = image("workers-llm")
    small = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}}
    idle = {"minReplicas": 0, "maxReplicas": 1, "targetBacklog": 4, "slots": 1}
    return {
        "instance": {"id": "inst-keda-test"},
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "roles": {role: {"replicas": 0} for role in
                  ("ingress", "router", "relay", "workersWorkflow", "egress")},
        "llmClasses": {"c1": {"minReplicas": MIN_REPLICAS, "maxReplicas": MAX_REPLICAS,
                              "targetBacklog": TARGET_BACKLOG, "slots": 1},
                       "c2": idle, "c3": idle, "c4": idle},
        "sizes": {size: small for size in ("small", "medium", "large", "xlarge")},
        "postgresql": {"bundled": {"enabled": True, "image": "/".join(image("postgres")),
                                   "persistence": {"size": "1Gi"}},
                       "existingSecret": f"{RELEASE}-postgresql"},
        "temporal": {"server": {"image": ":".join(image("temporal-server")),
                                "adminToolsImage": ":".join(image("temporal-admin-tools")),
                                "numHistoryShards": 4}},
        "secrets": {"database": {"existingSecret": f"{RELEASE}-database"},
                    "admin": {"existingSecret": f"{RELEASE}-admin"},
                    "outbox": {"existingSecret": f"{RELEASE}-outbox"}},
        "autoscaling": {"keda": {"enabled": True, "pollingInterval": 5,
                                 "scaleDownStabilizationSeconds": STABILIZATION_S}},
    }  # fmt: skip


def create_secrets() -> None:
    """The Secrets the chart names (bundled PostgreSQL: the URL names its Service)."""
    url = f"postgresql://postgres:{PG_PASSWORD}@{RELEASE}-eventos-postgresql:5432/eventos"
    for name, literal in (("postgresql", f"password={PG_PASSWORD}"), ("database", f"url={url}"),
                          ("admin", "token=keda-test-admin-token-0123"),
                          ("outbox", "keys=k1:" + "A" * 43 + "=")):  # fmt: skip
        kubectl("create", "secret", "generic", f"{RELEASE}-{name}", f"--from-literal={literal}")


@pytest.fixture(scope="module")
def keda(cluster: Cluster) -> Iterator[None]:
    """KEDA installed into the cluster for this module, removed after it."""
    cluster.run_cluster("keda")
    yield
    cluster.run_cluster("keda-down")


@pytest.fixture(scope="module")
def tier_l(cluster: Cluster, keda: None) -> Iterator[None]:
    """The chart at tier L with KEDA in its own namespace, the llm-c1 worker ready."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        create_secrets()
        with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
            json.dump(values(), file)
            file.flush()
            install = subprocess.run(
                [str(HELM), "install", RELEASE, str(CHART), "-n", NAMESPACE, "--timeout", "10m",
                 "-f", str(CHART / "values-tier-l.yaml"), "-f", file.name],
                capture_output=True, text=True, env={"KUBECONFIG": str(STATE / "kubeconfig")},
            )  # fmt: skip
        assert install.returncode == 0, install.stderr
        kubectl("rollout", "status", f"deployment/{DEPLOYMENT}", "--timeout=300s")
        kubectl("wait", f"scaledobject/{DEPLOYMENT}", "--for=condition=Ready", "--timeout=120s")
        yield
    finally:
        subprocess.run([str(HELM), "uninstall", RELEASE, "-n", NAMESPACE, "--wait"],
                       capture_output=True, env={"KUBECONFIG": str(STATE / "kubeconfig")})  # fmt: skip
        cluster.kubectl("delete", "namespace", NAMESPACE, "--timeout=180s", check=False)


@workflow.defn(name="KedaBacklogLoad", sandboxed=False)
class BacklogLoad:
    """One LLM step on llm-c1, as a turn would run it (no retries: a failure fails the test)."""

    @workflow.run
    async def run(self, step: LlmStepInput) -> LlmStepOutput:
        return await workflow.execute_activity(
            names.ACT_LLM_STEP, step, task_queue=QUEUE, result_type=LlmStepOutput,
            start_to_close_timeout=timedelta(minutes=1),
            schedule_to_close_timeout=timedelta(minutes=10),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )  # fmt: skip


def step(i: int) -> LlmStepInput:
    """A step the local model answers after STEP_SLEEP_S seconds."""
    return LlmStepInput(
        employee="keda-load", turn_id=f"keda-load-{i}", step=1, klass=1,
        model=ModelRef(provider="local", name="eventos-local"),
        messages=[ChatMessage(role="user", content=f"sleep: {STEP_SLEEP_S}\nstep {i}")],
    )  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """The class worker's scale and its queue's backlog at one moment."""

    t: float
    replicas: int  # the Deployment's spec.replicas, as the HPA set it
    ready: int
    backlog: int  # Temporal's approximate backlog of llm-c1's activity queue
    metric: str  # what KEDA's HPA last read (average backlog per replica)


class Sampler:
    """Reads the Deployment, the HPA and the queue; keeps every reading."""

    def __init__(self, client: Client) -> None:
        self.client, self.began, self.samples = client, time.monotonic(), list[Sample]()

    async def sample(self) -> Sample:
        deployment = json.loads(await asyncio.to_thread(
            kubectl, "get", "deployment", DEPLOYMENT, "-o", "json"))  # fmt: skip
        hpa = json.loads(await asyncio.to_thread(kubectl, "get", "hpa", HPA, "-o", "json"))
        current = hpa.get("status", {}).get("currentMetrics") or [{}]
        metric = current[0].get("external", {}).get("current", {}).get("averageValue", "-")
        found = Sample(round(time.monotonic() - self.began, 1),
                       deployment["spec"]["replicas"],
                       deployment.get("status", {}).get("readyReplicas", 0),
                       await self.backlog(), metric)  # fmt: skip
        self.samples.append(found)
        return found

    async def backlog(self) -> int:
        request = DescribeTaskQueueRequest(
            namespace=TEMPORAL_NAMESPACE,
            task_queue=TaskQueue(name=QUEUE, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY, report_stats=True,
        )  # fmt: skip
        response = await self.client.workflow_service.describe_task_queue(request)
        return int(response.stats.approximate_backlog_count)

    async def until(self, holds: Any, timeout: float, what: str) -> Sample:
        async def check() -> Sample | None:
            found = await self.sample()
            return found if holds(found) else None

        return await wait_for(check, timeout=timeout, interval=POLL_S, what=what)

    def table(self) -> str:
        rows = [f"{'t (s)':>7} {'replicas':>8} {'ready':>5} {'backlog':>7}  HPA metric"]
        rows += [f"{s.t:7.1f} {s.replicas:8d} {s.ready:5d} {s.backlog:7d}  {s.metric}"
                 for s in self.samples]  # fmt: skip
        return "\n".join(rows)


@pytest.fixture
def temporal_address(tier_l: None) -> Iterator[str]:
    """127.0.0.1:<port> forwarded to the chart's Temporal frontend."""
    argv = [str(KUBECTL), "--kubeconfig", str(STATE / "kubeconfig"), "-n", NAMESPACE,
            "port-forward", "--address", "127.0.0.1", f"svc/{TEMPORAL_SERVICE}", ":7233"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> 7233"
        assert line.startswith("Forwarding from 127.0.0.1:"), line + process.stderr.read()
        yield line.split()[2]
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass(frozen=True)
class Outcome:
    """What the load run saw: the readings, the first at full scale, each step's answer and the
    pods that ran the steps."""

    sampler: Sampler
    peak: Sample
    answers: list[str]
    workers: set[str]


async def run_load(address: str) -> Outcome:
    """Start the steps, watch llm-c1 scale out, wait for every step, watch it scale back in."""
    client = await connect(address, TEMPORAL_NAMESPACE)
    sampler = Sampler(client)
    await sampler.sample()
    async with Worker(client, task_queue=LOAD_QUEUE, workflows=[BacklogLoad]):
        handles = [await client.start_workflow(BacklogLoad.run, step(i), id=f"keda-load-{i}",
                                               task_queue=LOAD_QUEUE) for i in range(STEPS)]  # fmt: skip
        peak = await sampler.until(lambda s: s.replicas >= MAX_REPLICAS, timeout=240,
                                   what=f"{DEPLOYMENT} scaled out to {MAX_REPLICAS}")  # fmt: skip
        done = asyncio.gather(*(h.result() for h in handles))
        while not done.done():  # keep sampling while the pods drain the queue
            await asyncio.wait({done}, timeout=POLL_S)
            await sampler.sample()
        outputs = done.result()
    await sampler.until(lambda s: s.replicas == MIN_REPLICAS and s.backlog == 0,
                        timeout=STABILIZATION_S + 180,
                        what=f"{DEPLOYMENT} back to {MIN_REPLICAS} once drained")  # fmt: skip
    answers = [output.message.content for output in outputs]
    return Outcome(sampler, peak, answers, await step_workers(client))


async def step_workers(client: Client) -> set[str]:
    """The identities of the workers that ran the steps (from each workflow's history)."""
    identities = set()
    for i in range(STEPS):
        history = await client.get_workflow_handle(f"keda-load-{i}").fetch_history()
        identities |= {e.activity_task_started_event_attributes.identity for e in history.events
                       if e.HasField("activity_task_started_event_attributes")}  # fmt: skip
    return identities


def test_keda_scales_the_class_worker_out_on_backlog_and_back_in(temporal_address: str) -> None:
    outcome = asyncio.run(run_load(temporal_address))
    samples = outcome.sampler.samples
    print(
        f"\n{DEPLOYMENT}: {STEPS} steps of {STEP_SLEEP_S} s, one slot a pod, targetBacklog "
        f"{TARGET_BACKLOG}, replicas {MIN_REPLICAS}..{MAX_REPLICAS}\n{outcome.sampler.table()}"
    )
    print(f"steps run by {len(outcome.workers)} workers: {sorted(outcome.workers)}")
    assert outcome.answers == [f"[local] you said: step {i}" for i in range(STEPS)]
    assert max(s.backlog for s in samples[: samples.index(outcome.peak) + 1]) > TARGET_BACKLOG
    assert len(outcome.workers) > 1, "the pods KEDA added ran steps too"
    assert samples[-1].replicas == MIN_REPLICAS and samples[-1].backlog == 0
