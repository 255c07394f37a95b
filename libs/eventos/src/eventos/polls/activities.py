"""The poll activity (workers-workflow): one cycle per attempt, then a BENIGN ApplicationError
whose `next_retry_delay` is the wait until the next cycle (SPEC §7), so the activity never
completes and its retries write no workflow history."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta

import httpx
from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from eventos import names
from eventos.contracts import PollTrigger
from eventos.db import Conn
from eventos.polls.cycle import PollEnded, Poller, Verdict
from eventos.polls.fetch import http_client
from eventos.settings import OutboundSettings, SecretStore

HEARTBEAT_EVERY_S = 3.0  # about a third of policies.POLL_HEARTBEAT


def next_poll(verdict: Verdict) -> ApplicationError:
    """The BENIGN error ending an attempt: the next one comes after the verdict's delay."""
    detail = f": {verdict.error}" if verdict.error else ""
    return ApplicationError(
        f"{verdict.outcome}{detail}; next poll in {verdict.delay_s:.1f} s",
        type=names.POLL_NEXT, next_retry_delay=timedelta(seconds=verdict.delay_s),
        category=ApplicationErrorCategory.BENIGN,
    )  # fmt: skip


async def _heartbeat() -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(HEARTBEAT_EVERY_S)


class PollActivities:
    """The poll activity, holding the pool, the HTTP client and the secrets it resolves."""

    def __init__(self, pool: AsyncConnectionPool[Conn], secrets: SecretStore,
                 http: httpx.AsyncClient | None = None) -> None:  # fmt: skip
        self.poller = Poller(pool, http or http_client(OutboundSettings.from_env()), secrets)

    @activity.defn(name=names.ACT_POLL)
    async def poll_once(self, req: PollTrigger) -> None:
        """Poll once; always raises (the next poll, or the end when the generation stopped)."""
        beating = asyncio.create_task(_heartbeat())
        try:
            verdict = await self.poller.cycle(req)
        except PollEnded as exc:
            raise ApplicationError(str(exc), type=names.POLL_ENDED, non_retryable=True) from exc
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
        raise next_poll(verdict)

    def activities(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.poll_once]
