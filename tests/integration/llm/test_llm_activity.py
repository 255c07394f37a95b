"""`llm_step` on the real Temporal dev server: a test workflow calls it by name on the class
queues of a real LLM worker; retries, cancellation and metrics as a user of the stack sees them."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from conftest import PURPOSES, PURPOSES_VAR
from fake_openai import KEY, Answer, FakeOpenAI
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from psycopg_pool import AsyncConnectionPool
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.worker import Worker
from temporalio.workflow import ActivityCancellationType
from test_router import query

from eventos import names
from eventos.contracts import ChatMessage, LlmStepInput, LlmStepOutput, ModelRef
from eventos.db import Conn
from eventos.llm.activity import LlmActivities
from eventos.llm.endpoints import Endpoint, LlmEndpoints
from eventos.llm.local import local_call_id
from eventos.llm.prices import PriceTable
from eventos.llm.worker import llm_worker, run_llm_workers
from eventos.runtime import metrics
from eventos.runtime.temporal import TemporalConnection
from eventos.settings import SecretStore, TemporalSettings
from eventos.testing import wait_for

metrics.register("workers-llm")  # the families these tests read, as workers-llm serves them

pytestmark = pytest.mark.temporal

LOCAL = ModelRef("local", "scripted")
MARKER = "zebra-7731"  # in every prompt; must never reach /metrics


@dataclass(frozen=True)
class Probe:
    """One step for the test workflow, and how it calls the activity."""

    step: LlmStepInput
    workflow_queue: str
    initial_interval_s: float = 60.0  # long: a retry that comes sooner was told when to come
    maximum_attempts: int = 5
    heartbeat_timeout_s: float = 30.0


@workflow.defn(sandboxed=False)
class LlmProbeWorkflow:
    """Calls `llm_step` by name on the class queue, as the turn workflow does."""

    @workflow.run
    async def run(self, probe: Probe) -> LlmStepOutput:
        queue = names.queue_for(names.LLM_QUEUES[probe.step.klass], probe.workflow_queue)
        out: LlmStepOutput = await workflow.execute_activity(
            names.ACT_LLM_STEP,
            probe.step,
            result_type=LlmStepOutput,
            task_queue=queue,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=probe.heartbeat_timeout_s),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=probe.initial_interval_s),
                maximum_attempts=probe.maximum_attempts,
            ),
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        return out


@dataclass
class Stack:
    client: Client
    queue: str  # the test's workflow queue; LLM queues are namespaced by it
    fake: FakeOpenAI
    activities: LlmActivities | None = None

    def step(self, text: str, *, klass: int = 2, model: ModelRef = LOCAL) -> LlmStepInput:
        turn = f"turn-{uuid.uuid4().hex[:8]}"
        return LlmStepInput("support", turn, 0, klass, model, [ChatMessage("user", text)])

    async def start(
        self,
        step: LlmStepInput,
        *,
        initial_interval_s: float = 60.0,
        heartbeat_timeout_s: float = 30.0,
    ) -> WorkflowHandle[LlmProbeWorkflow, LlmStepOutput]:
        probe = Probe(step, self.queue, initial_interval_s, heartbeat_timeout_s=heartbeat_timeout_s)
        return await self.client.start_workflow(
            LlmProbeWorkflow.run,
            probe,
            id=f"llm-probe-{uuid.uuid4()}",
            task_queue=self.queue,
            execution_timeout=timedelta(seconds=60),
        )

    async def run(self, step: LlmStepInput) -> LlmStepOutput:
        handle = await self.start(step)
        return await asyncio.wait_for(handle.result(), 30)


PRICES = PriceTable.from_doc({"openai/*": {"input_per_mtok": 2.0, "output_per_mtok": 8.0}})


@pytest.fixture(scope="module")
async def fake_server() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def stack(
    temporal_settings: TemporalSettings, fake_server: FakeOpenAI, pool: AsyncConnectionPool[Conn]
) -> AsyncIterator[Stack]:
    """A workflow worker for the probe and a real LLM worker (class 2) on a fresh queue."""
    fake_server.reset()
    client = await Client.connect(temporal_settings.address, namespace=temporal_settings.namespace)
    queue = f"test-{uuid.uuid4()}"
    secrets = SecretStore(env={PURPOSES_VAR: PURPOSES, "EVENTOS_SECRET_FAKE_OPENAI": KEY})
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
        allowed = LlmEndpoints((Endpoint("fake", fake_server.base_url, ("fake-openai",)),))
        activities = LlmActivities(http, secrets, pool, PRICES, endpoints=allowed)
        async with (
            Worker(client, task_queue=queue, workflows=[LlmProbeWorkflow]),
            llm_worker(client, 2, 4, activities, workflow_queue=queue),
        ):
            yield Stack(client, queue, fake_server, activities)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_local_step_answers_with_a_labelled_quote(stack: Stack) -> None:
    out = await stack.run(stack.step(f"hello {MARKER}"))
    assert out.message == ChatMessage("assistant", f"[local] you said: hello {MARKER}")
    assert (out.finish_reason, out.input_tokens, out.output_tokens) == ("stop", 2, 5)


async def test_a_local_tool_call_batch_comes_back_as_one_message(stack: Stack) -> None:
    step = stack.step(
        f'{MARKER}\ncall: lookup_order {{"order": 42}}\ncall: weather {{"city": "Berlin"}}'
    )
    out = await stack.run(step)
    assert out.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in out.message.tool_calls] == [
        (local_call_id(step.turn_id, 0, 0), "lookup_order", '{"order": 42}'),
        (local_call_id(step.turn_id, 0, 1), "weather", '{"city": "Berlin"}'),
    ]


async def test_a_429_with_retry_after_is_retried_by_temporal_after_the_delay(stack: Stack) -> None:
    model = ModelRef("openai", "gpt-4o-mini", "fake-openai", stack.fake.base_url)
    stack.fake.queue(
        Answer(status=429, headers={"retry-after": "1"}, code="rate_limit_exceeded"),
        Answer(content="Back in stock tomorrow.", usage=(11, 5)),
    )
    started = time.monotonic()
    out = await stack.run(stack.step(f"is it in stock? {MARKER}", model=model))
    assert out.message.content == "Back in stock tomorrow."
    assert (out.input_tokens, out.output_tokens) == (11, 5)
    first, second = stack.fake.requests
    assert 0.9 <= second.at - first.at < 10  # the Retry-After, not the 60 s retry interval
    assert time.monotonic() - started < 15
    assert second.headers["authorization"] == f"Bearer {KEY}"


async def test_spend_counts_each_attempt_once(
    stack: Stack, started: str, pool: AsyncConnectionPool[Conn]
) -> None:
    """A refused attempt reserves and releases; the attempt that answers settles its actual
    cost; each under its own key (`{workflow_id}:{activity_id}:{attempt}`)."""
    model = ModelRef("openai", "gpt-4o-mini", "fake-openai", stack.fake.base_url)
    stack.fake.queue(
        Answer(status=429, headers={"retry-after": "1"}, code="rate_limit_exceeded"),
        Answer(content="fine", usage=(1000, 100)),
    )
    step = LlmStepInput(started, "turn-spend", 0, 2, model, [ChatMessage("user", "x" * 300)])
    await stack.run(step)
    rows = await query(pool, "SELECT key, state, estimate_usd, actual_usd FROM spend_events "
                       "ORDER BY key")  # fmt: skip
    assert [(r["key"].rsplit(":", 1)[1], r["state"], r["actual_usd"]) for r in rows] == [
        ("1", "released", Decimal(0)),
        ("2", "settled", Decimal("0.0028")),  # 1000 x 2 + 100 x 8 per million
    ]
    assert rows[0]["estimate_usd"] == PRICES.estimate(step)
    (spend,) = await query(pool, "SELECT reserved_usd, spent_usd FROM employee_spend")
    assert (spend["reserved_usd"], spend["spent_usd"]) == (0, Decimal("0.0028"))


async def test_a_429_with_retry_after_pauses_the_credential_for_every_class(
    stack: Stack, pool: AsyncConnectionPool[Conn]
) -> None:
    """A C2 step gets a 429 with Retry-After: 3; a C4 step on the same credential, started
    just after, reaches the provider only after the pause (it waited without a worker slot)."""
    assert stack.activities is not None
    model = ModelRef("openai", "gpt-4o-mini", "fake-openai", stack.fake.base_url)
    stack.fake.queue(Answer(status=429, headers={"retry-after": "3"}, code="rate_limit_exceeded"))
    async with llm_worker(stack.client, 4, 1, stack.activities, workflow_queue=stack.queue):
        customer = await stack.start(stack.step(f"customer {MARKER}", model=model))
        await wait_for(lambda: _seen(stack, 1), timeout=10, what="the 429")
        refused_at = stack.fake.requests[0].at
        background = await stack.start(stack.step(f"bg {MARKER}", klass=4, model=model))
        for handle in (customer, background):
            assert (await asyncio.wait_for(handle.result(), 30)).message.content
    later = [r.at - refused_at for r in stack.fake.requests[1:]]
    assert len(later) == 2 and min(later) >= 2.9, later  # both after the pause, neither before
    (pause,) = await query(pool, "SELECT credential, reason FROM provider_pauses")
    assert pause == {"credential": "fake-openai", "reason": "429 Retry-After"}


async def _seen(stack: Stack, n: int) -> bool:
    return len(stack.fake.requests) >= n


async def test_a_local_fail_line_is_retried_then_succeeds(stack: Stack) -> None:
    out = await stack.run(stack.step("hi\nfail: 503 1 retry-after=1"))
    assert out.message.content == "[local] you said: hi"


async def test_an_auth_error_fails_the_step_without_retrying(stack: Stack) -> None:
    model = ModelRef("openai", "gpt-4o-mini", "fake-openai", stack.fake.base_url)
    stack.fake.queue(Answer(status=401))
    handle = await stack.start(stack.step(MARKER, model=model), initial_interval_s=0.1)
    with pytest.raises(WorkflowFailureError) as caught:
        await asyncio.wait_for(handle.result(), 30)
    activity_error = caught.value.cause
    assert isinstance(activity_error, ActivityError)
    cause = activity_error.cause
    assert isinstance(cause, ApplicationError)
    assert (cause.type, cause.non_retryable) == ("ProviderAuthError", True)
    assert MARKER not in str(cause)
    assert len(stack.fake.requests) == 1


async def test_a_slow_step_heartbeats_and_is_cancelled(stack: Stack) -> None:
    before = sample(
        "gen_ai_client_operation_duration_seconds_count",
        gen_ai_provider_name="local", llm_class="c2", outcome="cancelled",
    )  # fmt: skip
    handle = await stack.start(stack.step("sleep: 60"), heartbeat_timeout_s=2)

    async def running() -> bool:
        pending = (await handle.describe()).raw_description.pending_activities
        return bool(pending) and pending[0].HasField("last_heartbeat_time")

    await wait_for(running, timeout=15, what="the step heartbeats")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as caught:
        await asyncio.wait_for(handle.result(), 15)  # far less than the 60 s sleep
    assert isinstance(caught.value.cause, CancelledError)

    async def counted() -> bool:
        now = sample(
            "gen_ai_client_operation_duration_seconds_count",
            gen_ai_provider_name="local", llm_class="c2", outcome="cancelled",
        )  # fmt: skip
        return now == before + 1

    await wait_for(counted, what="the cancelled attempt is measured")


async def test_metrics_count_tokens_and_durations_without_content(stack: Stack) -> None:
    labels = {"gen_ai_provider_name": "local", "llm_class": "c2"}
    inputs = sample("gen_ai_client_token_usage_sum", gen_ai_token_type="input", **labels)
    outputs = sample("gen_ai_client_token_usage_sum", gen_ai_token_type="output", **labels)
    steps = sample("gen_ai_client_operation_duration_seconds_count", outcome="ok", **labels)

    out = await stack.run(stack.step(f"count these four {MARKER}"))

    assert out.input_tokens == 4 and out.output_tokens == 7
    assert (
        sample("gen_ai_client_token_usage_sum", gen_ai_token_type="input", **labels) == inputs + 4
    )
    assert (
        sample("gen_ai_client_token_usage_sum", gen_ai_token_type="output", **labels) == outputs + 7
    )
    assert (
        sample("gen_ai_client_operation_duration_seconds_count", outcome="ok", **labels)
        == steps + 1
    )
    text = generate_latest().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    label_names = {
        name: {k for s in families[name].samples for k in s.labels} - {"le"}
        for name in ("gen_ai_client_token_usage", "gen_ai_client_operation_duration_seconds")
    }
    assert label_names == {
        "gen_ai_client_token_usage": {"gen_ai_token_type", "gen_ai_provider_name", "llm_class"},
        "gen_ai_client_operation_duration_seconds": {
            "gen_ai_provider_name",
            "llm_class",
            "outcome",
        },
    }
    for line in text.splitlines():
        if line.startswith("gen_ai_"):
            assert "support" not in line and "turn-" not in line
    assert MARKER not in text and "count these" not in text


async def test_run_llm_workers_polls_every_class_queue(
    temporal_settings: TemporalSettings, fake_server: FakeOpenAI, pool: AsyncConnectionPool[Conn]
) -> None:
    client = await Client.connect(temporal_settings.address, namespace=temporal_settings.namespace)
    queue = f"test-{uuid.uuid4()}"
    stack = Stack(client, queue, fake_server)
    async with httpx.AsyncClient() as http:
        activities = LlmActivities(http, SecretStore(env={}), pool, endpoints=LlmEndpoints())
        temporal = TemporalConnection(temporal_settings)
        slots = {1: 1, 2: 1, 3: 1, 4: 1}
        task = asyncio.create_task(
            run_llm_workers(temporal, names.CLASSES, activities, slots, workflow_queue=queue)
        )
        try:
            async with Worker(client, task_queue=queue, workflows=[LlmProbeWorkflow]):
                for klass in names.CLASSES:
                    out = await stack.run(stack.step(f"class {klass}", klass=klass))
                    assert out.message.content == f"[local] you said: class {klass}"
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 15)
