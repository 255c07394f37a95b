"""Skip Temporal's payload walks that cannot change a payload (the workflow worker's CPU).

The Python SDK (1.35) walks every payload of every workflow activation three times before the
workflow sees it (external storage references, external storage, the codec) and every payload
of every completion three times after (the codec, external storage, references). For each
payload it asks the sandboxed workflow instance for the payload's serialization context, which
runs code in the sandbox. With neither a payload codec nor external storage on the data
converter each walk hands back the payloads it was given, yet the walks were about a third of
the CPU of replaying a turn's history (`bench/turn_replay.py`). The SDK keeps the test for
exactly this case (`DataConverter._decode_payload_has_effect`, "temporary shortcircuit
detection while the _decode_* methods may no-op") but no longer calls it; `install` puts that
test, the SDK's own (so it follows what the SDK counts as an effect), in front of both walks. A
converter with a codec or external storage walks as before.

Given up without the walks: the SDK's refusal of an externally stored payload when no external
storage is configured (TMPRL1105). Nothing of ours writes one; such a payload would fail the
workflow task at its conversion instead.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import temporalio.bridge.worker as bridge_worker
from temporalio.converter import DataConverter
from temporalio.converter._extstore import StorageOperationMetrics

log = logging.getLogger(__name__)
WALKS = ("decode_activation", "encode_completion")
# The SDK's parameters of both walks: a change means the SDK changed under us.
PARAMETERS = {
    "decode_activation": ["activation", "data_converter", "decode_headers",
                          "storage_concurrency_limit"],
    "encode_completion": ["completion", "data_converter", "encode_headers",
                          "storage_concurrency_limit"],
}  # fmt: skip
SKIPS = "_eventos_skips_no_op_walks"
HAS_EFFECT = "_decode_payload_has_effect"  # the SDK's test: a codec or external storage


Walk = Callable[..., Awaitable[StorageOperationMetrics]]


def _skipping(walk: Walk) -> Walk:
    async def skip_when_no_op(message: Any, data_converter: DataConverter, *args: Any,
                              **kwargs: Any) -> StorageOperationMetrics:  # fmt: skip
        if getattr(data_converter, HAS_EFFECT):
            return await walk(message, data_converter, *args, **kwargs)
        return StorageOperationMetrics()

    setattr(skip_when_no_op, SKIPS, walk)
    return skip_when_no_op


def installed() -> bool:
    return all(hasattr(getattr(bridge_worker, name, None), SKIPS) for name in WALKS)


def install() -> bool:
    """Put the SDK's no-op test in front of both walks, once per process; False (and a warning,
    the walks left as they are) when the SDK's walks or its test are not the ones this was
    written for."""
    if installed():
        return True
    if not isinstance(getattr(DataConverter, HAS_EFFECT, None), property):
        log.warning("temporalio's DataConverter.%s is gone: payload walks left as they are",
                    HAS_EFFECT)  # fmt: skip
        return False
    for name in WALKS:
        walk = getattr(bridge_worker, name, None)
        if walk is None or list(inspect.signature(walk).parameters) != PARAMETERS[name]:
            log.warning("temporalio.bridge.worker.%s changed: payload walks left as they are",
                        name)  # fmt: skip
            return False
    for name in WALKS:
        setattr(bridge_worker, name, _skipping(getattr(bridge_worker, name)))
    return True


def uninstall() -> None:
    """The SDK's walks as they were (a bench's baseline, a test's control)."""
    for name in WALKS:
        walk = getattr(bridge_worker, name, None)
        if hasattr(walk, SKIPS):
            setattr(bridge_worker, name, getattr(walk, SKIPS))
