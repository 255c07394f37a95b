"""A Temporal data converter that refuses payloads over their size bound (SPEC I7).

Every value is encoded by the default JSON converter, then the size of each payload's data is
checked against its type's bound: 64 KB by default, more for types registered as transcript
carriers (`allow_large`). The check happens on encode only: what is already in history was
admitted when it was written, and refusing to read it would wedge replay without keeping
anything out of Temporal.

Bounds are keyed by the type's qualified name, not its identity, because the workflow sandbox
re-imports modules and so builds values of a fresh copy of each class.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Final, TypeVar, get_type_hints

from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import (
    AdvancedJSONEncoder,
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    JSONTypeConverter,
    value_to_type,
)
from temporalio.exceptions import ApplicationError

from eventos.contracts import (
    ConversationContext,
    DeliverBatch,
    LlmStepInput,
    LlmStepOutput,
    OfferInputs,
    SaveTurn,
    TurnInput,
)
from eventos.errors import EventOSError

T = TypeVar("T")

# Bounds are inclusive: a payload of exactly the bound passes.
PAYLOAD_LIMIT: Final = 64 * 1024  # I7: nothing over 64 KB enters Temporal.
STEP_LIMIT: Final = 1024 * 1024 - 1  # I7: each LLM-step input is under 1 MiB.
BATCH_LIMIT: Final = 256 * 1024 + 50 * 1024  # a batch's inputs plus ≤ 1 KB of fields each
CARRY_LIMIT: Final = 1_900_000 - 1  # I7: the continue-as-new carry is under 1.9 MB.
# The dev server's default per-payload limit; a larger bound would only move the failure there.
TEMPORAL_BLOB_LIMIT: Final = 2 * 1024 * 1024

_limits: dict[str, int] = {}


class PayloadTooLarge(EventOSError, ApplicationError):
    """A value is too large to enter Temporal (SPEC I7)."""

    # An ApplicationError so that, raised inside a workflow or activity, it fails that
    # execution once (non-retryable) instead of failing workflow tasks or retrying forever.
    def __init__(self, value_type: str, size: int, limit: int) -> None:
        self.value_type = value_type
        self.size = size
        self.limit = limit
        message = (
            f"a {value_type} payload is {size:,} bytes, over its {limit:,}-byte bound "
            "(SPEC I7); send large bodies by reference"
        )
        ApplicationError.__init__(self, message, type="PayloadTooLarge", non_retryable=True)


def type_name(cls: type) -> str:
    """The qualified name a bound is registered under."""
    return f"{cls.__module__}.{cls.__qualname__}"


def allow_large(cls: type[T], limit_bytes: int) -> type[T]:
    """Let values of exactly `cls` carry payloads up to `limit_bytes` bytes."""
    if not 0 < limit_bytes <= TEMPORAL_BLOB_LIMIT:
        raise ValueError(f"limit_bytes must be in 1..{TEMPORAL_BLOB_LIMIT}, got {limit_bytes}")
    _limits[type_name(cls)] = limit_bytes
    return cls


def limit_for(cls: type) -> int:
    """The payload bound of values of `cls`."""
    return _limits.get(type_name(cls), PAYLOAD_LIMIT)


def check(value: Any, payload: Payload) -> None:
    """Raise PayloadTooLarge if `payload`, encoded from `value`, is over its bound."""
    size = len(payload.data)
    limit = limit_for(type(value))
    if size > limit:
        raise PayloadTooLarge(type_name(type(value)), size, limit)


class FieldsJSONEncoder(AdvancedJSONEncoder):
    """Dataclasses as their fields, one level at a time. The JSON is the same as with
    `dataclasses.asdict`, without its deep copy of every nested dict and list (which was half
    of the relay's CPU per batch of 16 event payloads)."""

    def default(self, o: Any) -> Any:
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
        return super().default(o)


@functools.lru_cache(maxsize=512)  # per class (the sandbox's copies of a class count apart)
def field_types(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    hints = get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.init) for f in dataclasses.fields(cls))


class DataclassDecoder(JSONTypeConverter):
    """Decodes a dataclass with its field types resolved once per class. Temporal's own
    decoding resolves them for every value (`typing.get_type_hints`, evaluating each string
    annotation again): a quarter of the workflow worker's CPU in a burst, for the delivery
    items of every batch and turn. Same result: unknown keys ignored, a missing required field
    fails the construction, a field that does not convert is a TypeError (so a union tries
    its next member)."""

    def __init__(self) -> None:
        self.converters = [self]

    def to_typed_value(self, hint: type, value: Any) -> Any:
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            return JSONTypeConverter.Unhandled
        if not isinstance(value, dict):
            raise TypeError(f"Cannot convert to dataclass {hint}, value is {type(value)} not dict")
        init: dict[str, Any] = {}
        late: dict[str, Any] = {}
        for name, field_hint, in_init in field_types(hint):
            if name in value:
                try:
                    converted = value_to_type(field_hint, value[name], self.converters)
                except Exception as err:
                    raise TypeError(f"Failed converting field {name} on dataclass {hint}") from err
                (init if in_init else late)[name] = converted
        obj = hint(**init)
        for name, converted in late.items():
            object.__setattr__(obj, name, converted)
        return obj


class GuardedPayloadConverter(CompositePayloadConverter):
    """The default converters (JSON encoding dataclasses field by field, decoding them with
    their field types resolved once), refusing payloads over their bound on encode."""

    def __init__(self) -> None:
        super().__init__(*(
            JSONPlainPayloadConverter(encoder=FieldsJSONEncoder,
                                      custom_type_converters=[DataclassDecoder()])
            if isinstance(c, JSONPlainPayloadConverter) else c
            for c in DefaultPayloadConverter.default_encoding_payload_converters
        ))  # fmt: skip

    def to_payloads(self, values: Sequence[Any]) -> list[Payload]:
        payloads = super().to_payloads(values)
        for value, payload in zip(values, payloads, strict=True):
            check(value, payload)
        return payloads


allow_large(LlmStepInput, STEP_LIMIT)
allow_large(LlmStepOutput, STEP_LIMIT)
# Transcript carriers of a turn: the context it loads and the messages it saves.
allow_large(ConversationContext, STEP_LIMIT)
allow_large(SaveTurn, STEP_LIMIT)
# Batches of events, each within 64 KB, bounded by SPEC §8 itself (16 inputs or 256 KB per
# Signal, 50 inputs or 256 KB per turn) plus each input's delivery fields.
for _batch in (DeliverBatch, TurnInput, OfferInputs):
    allow_large(_batch, BATCH_LIMIT)

GUARDED_DATA_CONVERTER: Final = DataConverter(payload_converter_class=GuardedPayloadConverter)


async def connect(address: str, namespace: str) -> Client:
    """A Temporal client whose payloads pass the guard."""
    return await Client.connect(address, namespace=namespace, data_converter=GUARDED_DATA_CONVERTER)
