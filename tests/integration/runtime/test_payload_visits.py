"""The workers skip the SDK's payload walks only where they cannot change a payload
(eventos.runtime.payload_visits): with a codec the walks run, on a real Temporal server."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import temporalio.bridge.worker as bridge_worker
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.converter._extstore import StorageOperationMetrics
from temporalio.worker import Worker

from eventos.runtime import payload_visits
from eventos.runtime.payload_guard import GUARDED_DATA_CONVERTER
from eventos.settings import TemporalSettings

ENCODING = b"binary/test-base64"
DEADLINE = timedelta(seconds=30)


class Base64Codec(PayloadCodec):
    """A codec that changes every payload (so a walk skipped by mistake fails the workflow),
    counting what it encoded and decoded."""

    def __init__(self) -> None:
        self.encoded = 0
        self.decoded = 0

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.encoded += len(payloads)
        return [Payload(metadata={"encoding": ENCODING},
                        data=base64.b64encode(p.SerializeToString())) for p in payloads]  # fmt: skip

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != ENCODING:
                out.append(p)
                continue
            self.decoded += 1
            inner = Payload()
            inner.ParseFromString(base64.b64decode(p.data))
            out.append(inner)
        return out


@dataclass(frozen=True)
class Greeting:
    name: str


@activity.defn(name="test_visits_greet")
async def greet(who: Greeting) -> str:
    return f"hello {who.name}"


@workflow.defn
class GreetWorkflow:
    @workflow.run
    async def run(self, who: Greeting) -> str:
        return await workflow.execute_activity(
            greet, who, start_to_close_timeout=DEADLINE
        ) + await workflow.execute_local_activity(greet, who, start_to_close_timeout=DEADLINE)


@pytest.fixture
def skipping() -> Iterator[None]:
    """The walks as the workers run them, and as the SDK gives them back after."""
    assert payload_visits.install(), "the SDK's walks changed: payload_visits left them"
    yield
    payload_visits.uninstall()


def test_the_sdks_walks_are_the_ones_this_skips(skipping: None) -> None:
    assert payload_visits.installed()
    payload_visits.uninstall()
    assert not payload_visits.installed()
    assert payload_visits.install() and payload_visits.install()  # once, however often called


async def test_a_walk_runs_only_when_a_codec_or_storage_can_change_a_payload() -> None:
    walked: list[DataConverter] = []

    async def walk(message: Any, converter: DataConverter, *args: Any) -> StorageOperationMetrics:
        walked.append(converter)
        return StorageOperationMetrics()

    skip = payload_visits._skipping(walk)
    with_codec = DataConverter(payload_codec=Base64Codec())
    assert isinstance(await skip(None, GUARDED_DATA_CONVERTER, True, 1), StorageOperationMetrics)
    assert walked == []
    await skip(None, with_codec, True, 1)
    assert walked == [with_codec]


@pytest.mark.temporal
async def test_a_workers_codec_still_sees_every_payload(
    temporal_settings: TemporalSettings, skipping: None
) -> None:
    codec = Base64Codec()
    converter = DataConverter(payload_codec=codec)
    client = await Client.connect(temporal_settings.address,
                                  namespace=temporal_settings.namespace,
                                  data_converter=converter)  # fmt: skip
    queue = f"visits-{uuid.uuid4().hex[:8]}"
    assert hasattr(bridge_worker.decode_activation, payload_visits.SKIPS)
    async with Worker(client, task_queue=queue, workflows=[GreetWorkflow], activities=[greet]):
        result = await client.execute_workflow(
            GreetWorkflow.run, Greeting("ada"), id=f"visits-{uuid.uuid4()}", task_queue=queue,
            execution_timeout=DEADLINE,
        )  # fmt: skip
    assert result == "hello adahello ada"
    # The workflow's input, both calls' arguments and results, and its result crossed the
    # worker's walks encoded: a skipped walk would have handed the workflow base64 instead.
    assert codec.encoded >= 4 and codec.decoded >= 4, (codec.encoded, codec.decoded)
