"""The tool activity (workers-workflow): one activity type runs every tool call by its id.

A call that reaches outside heartbeats while it runs, so a worker that dies mid-call is
noticed within the heartbeat timeout and the next attempt applies the `unknown` rule.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.exceptions import ApplicationError

from eventos import names
from eventos.contracts import ToolCallInput, ToolResult
from eventos.db import Conn
from eventos.errors import NotFound
from eventos.settings import HttpToolSettings, OutboundSettings, SecretStore
from eventos.tools import http
from eventos.tools.runner import ToolRunner

HEARTBEAT_EVERY = timedelta(seconds=3)  # a third of the tool heartbeat timeout (policies)


class ToolActivities:
    """`tool_call` on the workflow queue, with the pool, the secrets and the tools' settings."""

    def __init__(self, pool: AsyncConnectionPool[Conn], secrets: SecretStore,
                 extras: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.runner = ToolRunner(pool, secrets, extras)

    @classmethod
    def from_env(cls, pool: AsyncConnectionPool[Conn]) -> ToolActivities:
        extras = {
            http.SETTINGS_KEY: HttpToolSettings.from_env(),
            http.OUTBOUND_KEY: OutboundSettings.from_env(),
        }
        return cls(pool, SecretStore.from_env(), extras)

    @activity.defn(name=names.ACT_TOOL)
    async def tool_call(self, call: ToolCallInput) -> ToolResult:
        beat = asyncio.create_task(_heartbeat())
        try:
            return await self.runner.run(call)
        except NotFound as exc:  # the generation or agent is gone: nothing to retry
            raise ApplicationError(str(exc), type="NotFound", non_retryable=True) from exc
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    def activities(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.tool_call]


async def _heartbeat() -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(HEARTBEAT_EVERY.total_seconds())
