"""Test helpers shipped with the shared package: the pytest plugin and waiting on conditions."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class ConditionTimeout(AssertionError):
    """A condition did not hold before its deadline."""


async def wait_for(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Await `condition()` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = await condition()
        if last:
            return last
        if time.monotonic() > deadline:
            raise ConditionTimeout(f"{what} did not hold within {timeout}s (last: {last!r})")
        await asyncio.sleep(interval)


def wait_for_sync(
    condition: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Blocking twin of wait_for, for tests that drive processes."""
    deadline = time.monotonic() + timeout
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() > deadline:
            raise ConditionTimeout(f"{what} did not hold within {timeout}s (last: {last!r})")
        time.sleep(interval)


def mentions(token: str, value: object) -> bool:
    """Whether `token` appears in `value`'s JSON as a whole word: a short id checked for a leak
    must not be found inside a random hex id or a hash that happens to hold its digits."""
    text = json.dumps(value, default=str)
    return re.search(rf"(?<![0-9A-Za-z]){re.escape(token)}(?![0-9A-Za-z])", text) is not None
