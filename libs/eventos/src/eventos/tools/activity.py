"""The tool activity (workers-workflow): one activity type runs every tool call by its id.

A call that reaches outside heartbeats while it runs, so a worker that dies mid-call is
noticed within the heartbeat timeout and the next attempt applies the `unknown` rule.

Errors are translated here, once, into a short fixed reason the model may read
(`names.TOOL_REASONS`): a database's error text quotes rows and query parameters, so it stays
in the log (type and SQLSTATE at INFO; the text, redacted, at DEBUG) and out of Temporal's
history and the transcript. A record the database refuses is not retried (it would be refused
again); an unavailable database and an unexpected error are, within the tool's retry policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.exceptions import ApplicationError

from eventos import failures, names
from eventos.alarms.activity import signal_changed
from eventos.contracts import ToolCallInput, ToolResult
from eventos.db import Conn, is_record_error
from eventos.errors import NotFound
from eventos.settings import AlarmSettings, HttpToolSettings, OutboundSettings, SecretStore
from eventos.tools import alarms, http
from eventos.tools.runner import ToolRunner

HEARTBEAT_EVERY = timedelta(seconds=3)  # a third of the tool heartbeat timeout (policies)

log = logging.getLogger(__name__)


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
            alarms.SETTINGS_KEY: AlarmSettings.from_env(),
        }
        return cls(pool, SecretStore.from_env(), extras)

    @activity.defn(name=names.ACT_TOOL)
    async def tool_call(self, call: ToolCallInput) -> ToolResult:
        beat = asyncio.create_task(_heartbeat())
        try:
            result = await self.runner.run(call)
            await _after_commit(call, result)
            return result
        except NotFound as exc:  # the generation or agent is gone: nothing to retry
            raise ApplicationError(str(exc), type="NotFound", non_retryable=True) from exc
        except Exception as exc:
            raise failure(call, exc) from None  # `from None`: no cause text in the history
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    def activities(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.tool_call]


def failure(call: ToolCallInput, exc: Exception) -> ApplicationError:
    """A failed attempt as Temporal records it and the model reads it: a fixed reason."""
    sqlstate = getattr(exc, "sqlstate", None) or "-"
    if is_record_error(exc):
        kind, retry = names.TOOL_ERROR_DATA, False
    elif isinstance(exc, psycopg.Error):
        kind, retry = names.TOOL_ERROR_DATABASE, True
    else:
        kind, retry = names.TOOL_ERROR_INTERNAL, True
    category = failures.TYPE_CATEGORIES.get(kind, failures.BUG)
    log.warning("tool call %s (%s) failed: %s: %s (SQLSTATE %s)", call.key, call.name, category,
                type(exc).__name__, sqlstate, exc_info=exc)  # fmt: skip
    return ApplicationError(names.TOOL_REASONS[kind], type=kind, non_retryable=not retry)


async def _after_commit(call: ToolCallInput, result: ToolResult) -> None:
    """What a call does once its transaction committed (a handler cannot signal inside it):
    a call that set or cancelled an alarm tells the supervisor. A retry that read the stored
    result tells it again (a hint, harmless); a failed Signal fails the attempt, so Temporal
    retries it and the retry reads the stored result and signals again."""
    if result.outcome == names.TOOL_OK and call.name in alarms.SIGNALS_SUPERVISOR:
        await signal_changed(activity.client(), call.employee, call.generation)


async def _heartbeat() -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(HEARTBEAT_EVERY.total_seconds())
