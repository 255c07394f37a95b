"""The Temporal SDK's runtime telemetry, from a real worker on a real server, in the Prometheus
registry (what /metrics serves and what the OTLP export carries): schedule-to-start of workflow
and activity tasks (the chart's queue-wait alerts read both) and polls per queue, the sticky
cache; never a workflow id."""

from __future__ import annotations

import uuid
from datetime import timedelta

from prometheus_client import CollectorRegistry, generate_latest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from eventos.settings import TemporalSettings
from eventos.telemetry.temporal_metrics import TemporalMetrics


@activity.defn(name="metrics_probe")
async def probe() -> str:
    return "done"


@workflow.defn(name="MetricsProbe", sandboxed=False)  # no module re-import needed
class MetricsProbe:
    @workflow.run
    async def run(self) -> str:
        return await workflow.execute_activity(probe, start_to_close_timeout=timedelta(seconds=10))


async def test_runtime_metrics_reach_the_registry_by_queue(
    temporal_settings: TemporalSettings,
) -> None:
    metrics = TemporalMetrics()
    registry = CollectorRegistry()
    registry.register(metrics)
    client = await Client.connect(temporal_settings.address, namespace=temporal_settings.namespace,
                                  runtime=metrics.runtime())  # fmt: skip
    queue = f"metrics-{uuid.uuid4().hex[:8]}"
    workflow_id = f"probe-{uuid.uuid4().hex}"
    async with Worker(client, task_queue=queue, workflows=[MetricsProbe], activities=[probe]):
        result = await client.execute_workflow(MetricsProbe.run, id=workflow_id, task_queue=queue,
                                               execution_timeout=timedelta(seconds=30))  # fmt: skip
    assert result == "done"
    text = generate_latest(registry).decode()
    assert f'temporal_workflow_task_schedule_to_start_latency_seconds_count{{queue="{queue}"' in (
        text
    ), text
    activity_waits = [
        line
        for line in text.splitlines()
        if line.startswith("temporal_activity_schedule_to_start_latency_seconds_")
    ]
    assert any(f'queue="{queue}"' in line for line in activity_waits), text
    assert f'queue="{queue}"' in text
    assert "temporal_sticky_cache_size" in text
    assert "temporal_workflow_task_queue_poll_succeed_total" in text
    assert workflow_id not in text and "task_queue=" not in text and "namespace=" not in text
