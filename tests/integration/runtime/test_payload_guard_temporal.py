"""The payload guard on a real Temporal server: oversized values never reach history (SPEC I7)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

# Not passed through the sandbox on purpose: workflow code then builds values of a re-imported
# copy of LlmStepInput, which must keep its transcript bound.
from eventos.contracts import ChatMessage, LlmStepInput, LlmStepOutput, ModelRef
from eventos.runtime.payload_guard import (
    GUARDED_DATA_CONVERTER,
    PAYLOAD_LIMIT,
    PayloadTooLarge,
    connect,
)
from eventos.settings import TemporalSettings

pytestmark = pytest.mark.temporal

DEADLINE = 30.0
EXECUTION_TIMEOUT = timedelta(seconds=DEADLINE)


@dataclass(frozen=True)
class Sized:
    size: int


@dataclass(frozen=True)
class Body:
    text: str


class StubActivities:
    """Stands in for the LLM worker; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    @activity.defn(name="test_llm_step")
    async def llm_step(self, step: LlmStepInput) -> LlmStepOutput:
        self.calls += 1
        received = sum(len(m.content) for m in step.messages)
        reply = ChatMessage(role="assistant", content="ok")
        return LlmStepOutput(reply, finish_reason="stop", input_tokens=received, output_tokens=1)

    @activity.defn(name="test_fetch_body")
    async def fetch_body(self, req: Sized) -> Body:
        self.calls += 1
        return Body(text="b" * req.size)


@workflow.defn
class TakeBodyWorkflow:
    @workflow.run
    async def run(self, body: Body) -> int:
        return len(body.text)


@workflow.defn
class ReturnBodyWorkflow:
    @workflow.run
    async def run(self, req: Sized) -> Body:
        return Body(text="R" * req.size)


@workflow.defn
class LlmStepWorkflow:
    @workflow.run
    async def run(self, req: Sized) -> int:
        chunk = 10_000
        step = LlmStepInput(
            employee="support",
            turn_id=workflow.info().workflow_id,
            step=1,
            klass=2,
            model=ModelRef(provider="local", name="scripted"),
            messages=[ChatMessage(role="user", content="m" * chunk)] * (req.size // chunk),
        )
        out = await workflow.execute_activity_method(
            StubActivities.llm_step, step, start_to_close_timeout=timedelta(seconds=10)
        )
        return out.input_tokens


@workflow.defn
class FetchBodyWorkflow:
    @workflow.run
    async def run(self, req: Sized) -> int:
        body = await workflow.execute_activity_method(
            StubActivities.fetch_body, req, start_to_close_timeout=timedelta(seconds=10)
        )
        return len(body.text)


@dataclass
class Guarded:
    client: Client
    queue: str
    stubs: StubActivities


@pytest.fixture(scope="module")
async def guarded_worker(temporal_settings: TemporalSettings) -> AsyncIterator[Guarded]:
    """A guarded client and a worker using the same converter on a fresh task queue, for the
    module (a worker validates its workflows in the sandbox as it starts: about a second)."""
    client = await connect(temporal_settings.address, temporal_settings.namespace)
    assert client.data_converter is GUARDED_DATA_CONVERTER
    queue = f"test-guard-{uuid.uuid4()}"
    stubs = StubActivities()
    workflows = [TakeBodyWorkflow, ReturnBodyWorkflow, LlmStepWorkflow, FetchBodyWorkflow]
    activities: list[Callable[..., Any]] = [stubs.llm_step, stubs.fetch_body]
    async with Worker(client, task_queue=queue, workflows=workflows, activities=activities):
        yield Guarded(client, queue, stubs)


@pytest.fixture
def guarded(guarded_worker: Guarded) -> Guarded:
    """The module's worker, its stubs' call count back at zero (each test's workflows have
    ids of their own)."""
    guarded_worker.stubs.calls = 0
    return guarded_worker


def workflow_id() -> str:
    return f"guard-{uuid.uuid4()}"


async def test_a_70_kb_argument_is_refused_and_nothing_starts(guarded: Guarded) -> None:
    wid = workflow_id()
    with pytest.raises(PayloadTooLarge) as refused:
        await guarded.client.start_workflow(
            TakeBodyWorkflow.run,
            Body("A" * 70_000),
            id=wid,
            task_queue=guarded.queue,
            execution_timeout=EXECUTION_TIMEOUT,
        )
    assert refused.value.size > PAYLOAD_LIMIT and "AAAA" not in str(refused.value)
    with pytest.raises(RPCError) as missing:
        await guarded.client.get_workflow_handle(wid).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND


async def test_a_60_kb_argument_goes_through(guarded: Guarded) -> None:
    result = await guarded.client.execute_workflow(
        TakeBodyWorkflow.run,
        Body("A" * 60_000),
        id=workflow_id(),
        task_queue=guarded.queue,
        execution_timeout=EXECUTION_TIMEOUT,
    )
    assert result == 60_000


async def test_a_70_kb_result_fails_the_workflow_and_stays_out_of_history(
    guarded: Guarded,
) -> None:
    handle = await guarded.client.start_workflow(
        ReturnBodyWorkflow.run,
        Sized(70_000),
        id=workflow_id(),
        task_queue=guarded.queue,
        execution_timeout=EXECUTION_TIMEOUT,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), DEADLINE)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "PayloadTooLarge"
    assert cause.non_retryable and "65,536" in cause.message and "RRRR" not in cause.message

    assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
    events = [e async for e in handle.fetch_history_events()]
    kinds = {e.event_type for e in events}
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED not in kinds
    assert max(e.ByteSize() for e in events) < PAYLOAD_LIMIT


async def test_a_500_kb_transcript_goes_through_an_activity(guarded: Guarded) -> None:
    handle = await guarded.client.start_workflow(
        LlmStepWorkflow.run,
        Sized(500_000),
        id=workflow_id(),
        task_queue=guarded.queue,
        execution_timeout=EXECUTION_TIMEOUT,
    )
    assert await asyncio.wait_for(handle.result(), DEADLINE) == 500_000
    assert guarded.stubs.calls == 1
    events = [e async for e in handle.fetch_history_events()]
    assert max(e.ByteSize() for e in events) > 500_000  # the transcript itself is in history


async def test_a_transcript_over_1_mib_fails_the_workflow_before_scheduling(
    guarded: Guarded,
) -> None:
    handle = await guarded.client.start_workflow(
        LlmStepWorkflow.run,
        Sized(1_050_000),
        id=workflow_id(),
        task_queue=guarded.queue,
        execution_timeout=EXECUTION_TIMEOUT,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), DEADLINE)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "PayloadTooLarge"
    assert "eventos.contracts.LlmStepInput" in cause.message
    assert guarded.stubs.calls == 0


async def test_a_70_kb_activity_result_fails_the_activity_once(guarded: Guarded) -> None:
    handle = await guarded.client.start_workflow(
        FetchBodyWorkflow.run,
        Sized(70_000),
        id=workflow_id(),
        task_queue=guarded.queue,
        execution_timeout=EXECUTION_TIMEOUT,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), DEADLINE)
    activity_error = failed.value.cause
    assert isinstance(activity_error, ActivityError)
    cause = activity_error.cause
    assert isinstance(cause, ApplicationError) and cause.type == "PayloadTooLarge"
    assert guarded.stubs.calls == 1
