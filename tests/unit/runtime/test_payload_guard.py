"""The payload guard: what may enter Temporal, by size and type (SPEC I7)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import pytest
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError

from eventos import contracts
from eventos.contracts import ChatMessage, LlmStepInput, LlmStepOutput, ModelRef
from eventos.errors import EventOSError
from eventos.runtime.payload_guard import (
    CARRY_LIMIT,
    GUARDED_DATA_CONVERTER,
    PAYLOAD_LIMIT,
    STEP_LIMIT,
    PayloadTooLarge,
    allow_large,
    field_types,
    limit_for,
)

converter = GUARDED_DATA_CONVERTER.payload_converter


def encoded_size(value: Any) -> int:
    return len(DataConverter.default.payload_converter.to_payload(value).data)


def step_input(transcript_bytes: int) -> LlmStepInput:
    """A step input whose transcript holds about `transcript_bytes` bytes of text."""
    chunk = 10_000
    messages = [ChatMessage(role="user", content="q" * chunk)] * (transcript_bytes // chunk)
    return LlmStepInput(
        employee="support",
        turn_id="turn-1",
        step=1,
        klass=2,
        model=ModelRef(provider="local", name="scripted"),
        messages=messages,
    )


def test_a_70_kb_dict_is_refused_naming_type_and_sizes_not_content() -> None:
    value = {"body": "secret-" + "s" * 70_000}
    with pytest.raises(PayloadTooLarge) as refused:
        converter.to_payloads([{"small": 1}, value])
    err = refused.value
    assert (err.value_type, err.size, err.limit) == ("builtins.dict", encoded_size(value), 65_536)
    assert "builtins.dict" in str(err) and f"{err.size:,}" in str(err) and "65,536" in str(err)
    assert "secret" not in str(err) and "sss" not in str(err)


def test_a_60_kb_dict_passes_and_decodes() -> None:
    value = {"body": "s" * 60_000}
    [payload] = converter.to_payloads([value])
    assert converter.from_payloads([payload]) == [value]


def test_the_64_kb_bound_is_inclusive() -> None:
    # A JSON string is its text plus two quotes.
    converter.to_payload("x" * (PAYLOAD_LIMIT - 2))
    with pytest.raises(PayloadTooLarge):
        converter.to_payload("x" * (PAYLOAD_LIMIT - 1))


def test_a_step_input_with_a_500_kb_transcript_passes_and_round_trips() -> None:
    value = step_input(500_000)
    payload = converter.to_payload(value)
    assert len(payload.data) > 500_000
    assert converter.from_payload(payload, LlmStepInput) == value


def test_a_step_input_over_1_mib_is_refused() -> None:
    with pytest.raises(PayloadTooLarge) as refused:
        converter.to_payload(step_input(1_050_000))
    assert refused.value.value_type == "eventos.contracts.LlmStepInput"
    assert refused.value.limit == STEP_LIMIT == 1024 * 1024 - 1


def test_a_step_output_has_the_step_bound() -> None:
    def output(size: int) -> LlmStepOutput:
        message = ChatMessage(role="assistant", content="a" * size)
        return LlmStepOutput(message=message, finish_reason="stop", input_tokens=1, output_tokens=1)

    converter.to_payload(output(500_000))
    with pytest.raises(PayloadTooLarge):
        converter.to_payload(output(1_050_000))


def test_a_registered_type_gets_its_bound() -> None:
    @dataclass
    class Carry:
        transcript: str

    big = Carry(transcript="c" * 1_500_000)
    with pytest.raises(PayloadTooLarge):
        converter.to_payload(big)

    assert allow_large(Carry, CARRY_LIMIT) is Carry
    assert limit_for(Carry) == 1_899_999
    converter.to_payload(big)
    with pytest.raises(PayloadTooLarge) as refused:
        converter.to_payload(Carry(transcript="c" * 1_900_000))
    assert refused.value.limit == CARRY_LIMIT
    # Only the registered type: other values keep the 64 KB bound.
    with pytest.raises(PayloadTooLarge):
        converter.to_payload({"transcript": "c" * 100_000})


@pytest.mark.parametrize("limit", [0, -1, 2 * 1024 * 1024 + 1])
def test_a_bound_temporal_would_not_take_is_refused(limit: int) -> None:
    @dataclass
    class Carry:
        transcript: str

    with pytest.raises(ValueError, match="limit_bytes"):
        allow_large(Carry, limit)


def test_a_re_imported_copy_of_a_carrier_keeps_its_bound() -> None:
    # The workflow sandbox re-imports modules, so workflow code builds values of a copy.
    assert contracts.__file__ is not None
    spec = importlib.util.spec_from_file_location("eventos.contracts", contracts.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert copy.LlmStepInput is not LlmStepInput

    original = step_input(500_000)
    value = copy.LlmStepInput(
        **{**original.__dict__, "model": copy.ModelRef(provider="local", name="scripted")}
    )
    assert len(converter.to_payload(value).data) > 500_000


async def test_the_data_converter_refuses_on_encode() -> None:
    await GUARDED_DATA_CONVERTER.encode([{"body": "s" * 60_000}])
    with pytest.raises(PayloadTooLarge):
        await GUARDED_DATA_CONVERTER.encode([{"body": "s" * 70_000}])


async def test_decoding_does_not_check_what_history_already_holds() -> None:
    value = {"body": "s" * 70_000}
    payloads = await DataConverter.default.encode([value])
    assert await GUARDED_DATA_CONVERTER.decode(payloads, [dict]) == [value]


def test_the_error_fails_a_temporal_execution_once() -> None:
    err = PayloadTooLarge("builtins.dict", 70_000, PAYLOAD_LIMIT)
    assert isinstance(err, EventOSError) and isinstance(err, ApplicationError)
    assert err.type == "PayloadTooLarge" and err.non_retryable


def test_dataclasses_encode_exactly_as_the_default_converter_does() -> None:
    """Field by field (no deep copy), yet byte for byte the default JSON, and it round-trips."""
    item = contracts.DeliveryItem(
        seq=3, ingress_id=9, klass=2, type="msg", route={"agent": "a", "kind": ("x", "y")},
        chain_id="c", hop=1, size=40, payload={"data": {"text": "hé", "n": [1, {"k": None}]}},
    )  # fmt: skip
    batch = contracts.DeliverBatch("s/g1/talk/main", [item, item])
    ours = converter.to_payloads([batch, step_input(20_000), None, b"raw"])
    default = DataConverter.default.payload_converter.to_payloads(
        [batch, step_input(20_000), None, b"raw"]
    )
    assert [(p.metadata, p.data) for p in ours] == [(p.metadata, p.data) for p in default]
    (back,) = converter.from_payloads(ours[:1], [contracts.DeliverBatch])
    assert back.items[1].payload == item.payload and back.items[0].route["kind"] == ["x", "y"]


def test_contracts_decode_as_temporals_own_converter_decodes_them() -> None:
    """The guard's decoder (field types resolved once per class) gives the same values."""
    item = contracts.DeliveryItem(3, 41, 2, "chat.message", {"kind": "chat"}, "c-1", 1, 90,
                                  {"data": {"text": "hi"}}, None, "cause")  # fmt: skip
    ref = contracts.TranscriptRef(1, "front", "main", 12, 3400)
    values: list[Any] = [
        contracts.TurnInput(
            "t-1", "ada", 1, "front", "main", "ada/1/talk/main", 2, {"kind": "chat"}, [item, item]
        ),
        contracts.DeliverBatch("ada/1/talk/main", [item]),
        LlmStepInput(
            "ada",
            "t-1",
            0,
            1,
            ModelRef("local", "scripted"),
            [ChatMessage("assistant", "", [contracts.ToolCall("c", "f", "{}")])],
            transcript=ref,
        ),
        LlmStepInput("ada", "t-1", 0, 1, ModelRef("local", "scripted"), []),  # no transcript
        contracts.ConversationContext(ModelRef("openai", "m", "key"), "You help.", stored=ref),
    ]
    default = DataConverter.default.payload_converter
    looked_up = field_types.cache_info()
    for value in values:
        [payload] = converter.to_payloads([value])
        [ours] = converter.from_payloads([payload], [type(value)])
        [theirs] = default.from_payloads([payload], [type(value)])
        assert ours == theirs == value, type(value)
    now = field_types.cache_info()
    assert now.hits + now.misses > looked_up.hits + looked_up.misses  # ours decoded them
    assert now.hits > looked_up.hits  # … with each class's field types resolved once


def test_a_contract_that_does_not_fit_its_type_is_refused_on_decode() -> None:
    [payload] = converter.to_payloads([{"stream_key": "s", "items": [{"seq": "not a number"}]}])
    with pytest.raises(Exception, match="DeliverBatch"):
        converter.from_payloads([payload], [contracts.DeliverBatch])
