"""A backlog on a tier L class queue, for KEDA's scale-out test: real `llm_step` activities on
`llm-c1`, started by a workflow the test runs through a port-forward to Temporal, each run by
the chart's llm-c1 pods on the local model, which sleeps as the step's script says; and a
sampler of the class Deployment's replicas, KEDA's HPA and the queue's backlog over time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from k8s_release import Release
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

TEMPORAL_NAMESPACE = "default"
LOAD_QUEUE = "keda-backlog-load"  # the test's own workflow queue; the steps go to llm-c1
QUEUE = names.LLM_QUEUES[1]
STEPS = 40
STEP_SLEEP_S = 4
MIN_REPLICAS, MAX_REPLICAS, TARGET_BACKLOG = 1, 4, 2
STABILIZATION_S = 20
POLL_S = 2.0


def keda_values() -> list[str]:
    """llm-c1 with one slot a pod, scaled by KEDA between MIN and MAX_REPLICAS at
    TARGET_BACKLOG a replica with a short stabilization window; the other classes at one pod."""
    c1 = {"minReplicas": MIN_REPLICAS, "maxReplicas": MAX_REPLICAS,
          "targetBacklog": TARGET_BACKLOG, "slots": 1}  # fmt: skip
    one = {"minReplicas": 1, "maxReplicas": 1}
    sets = [f"llmClasses.{klass}.{key}={value}"
            for klass, limits in {"c1": c1, "c2": one, "c3": one, "c4": one}.items()
            for key, value in limits.items()]  # fmt: skip
    return [*sets, "autoscaling.keda.enabled=true", "autoscaling.keda.pollingInterval=5",
            f"autoscaling.keda.scaleDownStabilizationSeconds={STABILIZATION_S}"]  # fmt: skip


@workflow.defn(name="KedaBacklogLoad", sandboxed=False)
class BacklogLoad:
    """One LLM step on llm-c1, as a turn would run it (no retries: a failure fails the test)."""

    @workflow.run
    async def run(self, step: LlmStepInput) -> LlmStepOutput:
        output: LlmStepOutput = await workflow.execute_activity(
            names.ACT_LLM_STEP, step, task_queue=QUEUE, result_type=LlmStepOutput,
            start_to_close_timeout=timedelta(minutes=1),
            schedule_to_close_timeout=timedelta(minutes=10),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )  # fmt: skip
        return output


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
    metric: str  # what KEDA's HPA last read: the backlog per replica (AverageValue)


class Sampler:
    """Reads the Deployment, the HPA and the queue; keeps every reading."""

    def __init__(self, release: Release, client: Client) -> None:
        self.release, self.client = release, client
        self.deployment = f"{release.prefix}-llm-c1"
        self.hpa = f"keda-hpa-{self.deployment}"  # the HPA KEDA makes for the ScaledObject
        self.began, self.samples = time.monotonic(), list[Sample]()

    async def get(self, kind: str, name: str) -> Any:
        out = await asyncio.to_thread(self.release.kubectl, "get", kind, name, "-o", "json")
        return json.loads(out)

    async def sample(self) -> Sample:
        """One reading, kept."""
        deployment = await self.get("deployment", self.deployment)
        hpa = await self.get("hpa", self.hpa)
        current = hpa.get("status", {}).get("currentMetrics") or [{}]
        metric = current[0].get("external", {}).get("current", {}).get("averageValue", "-")
        found = Sample(round(time.monotonic() - self.began, 1),
                       deployment["spec"]["replicas"],
                       deployment.get("status", {}).get("readyReplicas", 0),
                       await self.backlog(), metric)  # fmt: skip
        self.samples.append(found)
        return found

    async def backlog(self) -> int:
        """The activity backlog of llm-c1 as the frontend reports it (what KEDA reads too)."""
        request = DescribeTaskQueueRequest(
            namespace=TEMPORAL_NAMESPACE,
            task_queue=TaskQueue(name=QUEUE, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY, report_stats=True,
        )  # fmt: skip
        response = await self.client.workflow_service.describe_task_queue(request)
        return int(response.stats.approximate_backlog_count)

    async def until(self, holds: Callable[[Sample], bool], timeout: float, what: str) -> Sample:
        """Sample every POLL_S seconds until a reading satisfies `holds`; that reading."""

        async def check() -> list[Sample]:  # a one-item list: falsy only while it does not hold
            found = await self.sample()
            return [found] if holds(found) else []

        return (await wait_for(check, timeout=timeout, interval=POLL_S, what=what))[0]

    def table(self) -> str:
        rows = [
            f"{'t (s)':>7} {'replicas':>8} {'ready':>5} {'backlog':>7}  HPA's backlog per replica"
        ]
        rows += [f"{s.t:7.1f} {s.replicas:8d} {s.ready:5d} {s.backlog:7d}  {s.metric}"
                 for s in self.samples]  # fmt: skip
        return "\n".join(rows)


@dataclass(frozen=True)
class Outcome:
    """What the load run saw: the readings, the first at full scale, each step's answer and the
    pods that ran the steps."""

    sampler: Sampler
    peak: Sample
    answers: list[str]
    workers: set[str]


async def run_load(release: Release, address: str) -> Outcome:
    """Start the steps, watch llm-c1 scale out, wait for every step, watch it scale back in."""
    client = await connect(address, TEMPORAL_NAMESPACE)
    sampler = Sampler(release, client)
    await sampler.sample()
    async with Worker(client, task_queue=LOAD_QUEUE, workflows=[BacklogLoad]):
        handles = [await client.start_workflow(BacklogLoad.run, step(i), id=f"keda-load-{i}",
                                               task_queue=LOAD_QUEUE) for i in range(STEPS)]  # fmt: skip
        peak = await sampler.until(lambda s: s.replicas >= MAX_REPLICAS, timeout=240,
                                   what=f"{sampler.deployment} scaled out to {MAX_REPLICAS}")  # fmt: skip
        done = asyncio.gather(*(h.result() for h in handles))
        while not done.done():  # keep sampling while the pods drain the queue
            await asyncio.wait({done}, timeout=POLL_S)
            await sampler.sample()
        outputs = done.result()
    await sampler.until(lambda s: s.replicas == MIN_REPLICAS and s.backlog == 0,
                        timeout=STABILIZATION_S + 180,
                        what=f"{sampler.deployment} back to {MIN_REPLICAS} once drained")  # fmt: skip
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
