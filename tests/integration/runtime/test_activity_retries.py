"""Every Worker of ours counts activity attempts past the threshold by activity type (SPEC §12,
`eventos_activity_retries_total`): a real workflow on the dev server retries a stub activity,
registered under a test's own name, until its sixth attempt succeeds."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from metrics_table import sample
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

from eventos.runtime.metrics import ACTIVITY_RETRIES, RETRY_THRESHOLD
from eventos.runtime.payload_guard import connect
from eventos.runtime.temporal import RetryCount
from eventos.settings import TemporalSettings

pytestmark = pytest.mark.temporal

ACTIVITY = "flaky_for_the_retry_count"
SUCCEEDS_ON = RETRY_THRESHOLD + 3  # attempts past the threshold: 3 (4, 5 and 6)


@activity.defn(name=ACTIVITY)
async def flaky() -> int:
    attempt = activity.info().attempt
    if attempt < SUCCEEDS_ON:
        raise RuntimeError(f"attempt {attempt} fails on purpose")
    return attempt


@workflow.defn(name="RetryCountProbe", sandboxed=False)
class RetryCountProbe:
    @workflow.run
    async def run(self) -> int:
        policy = RetryPolicy(initial_interval=timedelta(milliseconds=50), backoff_coefficient=1.0,
                             maximum_attempts=SUCCEEDS_ON)  # fmt: skip
        return int(await workflow.execute_activity(
            ACTIVITY, start_to_close_timeout=timedelta(seconds=5), retry_policy=policy))  # fmt: skip


@pytest.fixture
async def client(temporal_settings: TemporalSettings) -> Client:
    return await connect(temporal_settings.address, temporal_settings.namespace)


async def test_attempts_past_the_threshold_are_counted_by_type(client: Client) -> None:
    """(Local activities pass the same inbound interceptor; this SDK's core panics in a tokio
    thread when a worker stops right after local-activity retries, so they are not run here.)"""
    queue = f"retries-{uuid.uuid4().hex[:8]}"
    before = sample(ACTIVITY_RETRIES, activity_type=ACTIVITY)
    async with Worker(client, task_queue=queue, workflows=[RetryCountProbe], activities=[flaky],
                      interceptors=[RetryCount()]):  # fmt: skip
        attempt = await client.execute_workflow(
            RetryCountProbe.run, id=f"retry-count-{uuid.uuid4().hex}", task_queue=queue,
            execution_timeout=timedelta(seconds=60),
        )  # fmt: skip
    assert attempt == SUCCEEDS_ON
    assert (
        sample(ACTIVITY_RETRIES, activity_type=ACTIVITY) == before + SUCCEEDS_ON - RETRY_THRESHOLD
    )
