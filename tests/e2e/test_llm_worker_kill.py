"""SIGKILL of the LLM worker while a step is at the provider: the step is retried on the next
worker, the input is consumed once and the owner gets exactly one reply (SPEC §8, I9).

The six services run as processes on the session's dev server; the model is the loopback fake
OpenAI server, told to hold the first request open so the step is surely mid-flight when the
worker dies. Temporal notices the dead attempt by its heartbeat timeout, so the retry comes
that long after the kill: 20 s here (EVENTOS_TURN_LLM_HEARTBEAT_S; 60 s by default).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import E2E_TIMEOUT_S
from fake_openai import KEY, Answer, FakeOpenAI
from stack import Owner, Stack, base_env, one, reply_rows, rows, run_async, until
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus

from eventos.settings import DatabaseSettings, TemporalSettings

# Whole stacks of processes on a small shared machine: a longer hang limit than the default.
pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

REPLY = "Hello from the fake."
HEARTBEAT_S = 20  # the step's heartbeat timeout (settings.TurnTimeouts; the worker beats at 10 s)
RETRY_S = 150.0  # heartbeat timeout + retry + the rest of the turn, on a busy machine

SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents:
    - name: front
      model: {{provider: openai, name: gpt-fake, credential: fake-openai, base_url: "{base_url}"}}
      system: You help.
  triggers:
    - {{kind: chat}}
"""


class FakeInThread:
    """The fake OpenAI server on its own event loop, in a thread of this process."""

    def __init__(self) -> None:
        self.fake = FakeOpenAI()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(15)
        return self.fake

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(15)
        self.loop.close()


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeInThread() as server:
        yield server


@pytest.fixture
def stack(
    db_settings: DatabaseSettings,
    temporal_settings: TemporalSettings,
    fake: FakeOpenAI,
    tmp_path: Path,
) -> Iterator[Stack]:
    env = base_env(db_settings.url, temporal_settings.address, temporal_settings.namespace,
                   tmp_path / "blobs")  # fmt: skip
    env["EVENTOS_SECRET_FAKE_OPENAI"] = KEY
    # The operator allows the fake (ingress checks it on apply, the LLM worker on every call).
    fake_endpoint = {"base_url": fake.base_url, "credentials": ["fake-openai"]}
    env["EVENTOS_LLM_ENDPOINTS"] = json.dumps({"fake": fake_endpoint})
    env["EVENTOS_TURN_LLM_HEARTBEAT_S"] = str(HEARTBEAT_S)  # the relay's cursors carry it
    with Stack(env, tmp_path) as running:
        yield running


async def turn_history(settings: TemporalSettings, turn_id: str) -> list[HistoryEvent]:
    """The TurnWorkflow's history once it has completed; empty before."""
    client = await Client.connect(settings.address, namespace=settings.namespace)
    handle = client.get_workflow_handle(turn_id)
    if (await handle.describe()).status != WorkflowExecutionStatus.COMPLETED:
        return []
    return list((await handle.fetch_history()).events)


def test_sigkill_of_the_llm_worker_mid_step_retries_the_step_and_replies_once(
    stack: Stack,
    fake: FakeOpenAI,
    db_settings: DatabaseSettings,
    temporal_settings: TemporalSettings,
) -> None:
    url = db_settings.url
    # A name of its own: workflow ids on the session's shared dev server never collide.
    name = f"k{uuid.uuid4().hex[:8]}"
    owner = Owner(stack.ingress_url)
    owner.apply_and_start(SPEC.format(name=name, base_url=fake.base_url), name)
    fake.queue(Answer(hang=True))  # the first attempt never gets an answer

    message_id = owner.chat(name, "what is on today?")
    until(lambda: fake.requests, 60, "the step's request at the provider", stack)
    (turn,) = rows(url, "SELECT id, status, class, consumed_seq FROM turns")
    assert (turn["status"], turn["class"], turn["consumed_seq"]) == ("running", 1, None)
    assert one(url, "SELECT consumed_seq FROM bus_streams") == 0

    stack["workers-llm"].kill()
    assert owner.message(name, message_id)["reply"] is None
    stack["workers-llm"].start()  # a new process on the same queues

    def replied() -> Any:
        return owner.message(name, message_id)["reply"]

    assert until(replied, RETRY_S, "the reply after the retried step", stack) == REPLY
    history = until(
        lambda: run_async(turn_history(temporal_settings, turn["id"])), 30, "turn closed", stack
    )
    # The entity gives the slot back after the turn: wait for that too before counting rows.
    until(lambda: not rows(url, "SELECT 1 FROM sched_leases"), 30, "slot given back", stack)
    assert_step_retried_once(fake, history, turn["id"])
    assert_consumed_and_answered_once(url, message_id, turn["id"])


def assert_step_retried_once(fake: FakeOpenAI, history: list[HistoryEvent], turn_id: str) -> None:
    """The provider saw the same step twice, and Temporal ran it as attempt 2 of one step
    after the dead attempt's heartbeat timed out."""
    assert len(fake.requests) == 2
    first, second = (r.body for r in fake.requests)
    assert second["messages"] == first["messages"]
    assert second["model"] == first["model"] == "gpt-fake"
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][-1]["content"] == "what is on today?"
    steps = [e for e in history if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
             and e.activity_task_scheduled_event_attributes.activity_type.name == "llm_step"]  # fmt: skip
    ids = [s.activity_task_scheduled_event_attributes.activity_id for s in steps]
    assert ids == [f"{turn_id}:step-0"]
    # The operator's heartbeat timeout, from the relay's settings through the turn's input.
    scheduled = steps[0].activity_task_scheduled_event_attributes
    assert scheduled.heartbeat_timeout.ToSeconds() == HEARTBEAT_S
    (started,) = [
        e.activity_task_started_event_attributes
        for e in history
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id == steps[0].event_id
    ]
    assert started.attempt == 2
    timeout = started.last_failure.timeout_failure_info.timeout_type
    assert timeout == TimeoutType.TIMEOUT_TYPE_HEARTBEAT


def assert_consumed_and_answered_once(url: str, message_id: int, turn_id: str) -> None:
    """One turn, done, consumed through the message's seq (the stream's cursor stands there
    too); one outbox row, sent; one reply shown to the owner; the message answered."""
    seq = one(url, "SELECT d.seq FROM bus_deliveries d JOIN chat_messages m "
                   "ON m.ingress_id = d.ingress_id WHERE m.id = %(id)s", {"id": message_id})  # fmt: skip
    (turn,) = rows(url, "SELECT id, status, consumed_seq FROM turns")
    assert (turn["id"], turn["status"], turn["consumed_seq"]) == (turn_id, "done", seq)
    (stream,) = rows(url, "SELECT delivered_seq, consumed_seq, next_seq FROM bus_streams")
    assert (stream["delivered_seq"], stream["consumed_seq"]) == (seq, seq)
    assert stream["next_seq"] == seq + 1
    assert [r["status"] for r in rows(url, "SELECT status FROM bus_deliveries")] == ["done"]
    (out,) = rows(url, "SELECT id, status, body, turn_id FROM outbound_messages")
    assert (out["status"], out["body"], out["turn_id"]) == ("sent", REPLY, turn_id)
    (shown,) = reply_rows(url)
    assert (shown["outbound_id"], shown["text"], shown["turn_id"]) == (out["id"], REPLY, turn_id)
    (message,) = rows(url, "SELECT status, turn_id FROM chat_messages")
    assert (message["status"], message["turn_id"]) == ("answered", turn_id)
    stored = rows(url, "SELECT message FROM transcript_messages ORDER BY n")
    roles = [r["message"]["role"] for r in stored]
    assert roles == ["user", "assistant"]
