"""The `llm_step` activity: one model call of a turn, heartbeating while the provider works.

Metrics follow the OpenTelemetry GenAI conventions; their labels never carry employee, thread
or content, and the INFO log line names the step, never the prompt or the reply.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

import httpx
from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from eventos import names
from eventos.contracts import LlmStepInput, LlmStepOutput
from eventos.conversations import transcripts
from eventos.db import Conn
from eventos.errors import BudgetExceeded, BudgetHeld
from eventos.llm import buckets
from eventos.llm.buckets import RateLimits, credential_of
from eventos.llm.endpoints import LlmEndpoints
from eventos.llm.prices import PriceTable, prompt_tokens
from eventos.llm.providers import provider_for
from eventos.runtime.metrics import OPERATION_DURATION, RATE_WAITS, SLOT_WAIT, TOKEN_USAGE
from eventos.scheduling import ledger
from eventos.scheduling.ledger import Reservation
from eventos.settings import SecretStore

log = logging.getLogger(__name__)
T = TypeVar("T")

HEARTBEAT_S = 10.0
KNOWN_PROVIDERS = ("openai", "local")


def spend_key(info: activity.Info) -> str:
    """`{workflow_id}:{activity_id}:{attempt}`: a call to the provider's own API is billed per
    attempt (a gateway that deduplicates by key would drop the attempt). Activity ids are
    unique across the chain (SPEC §7)."""
    return f"{info.workflow_id}:{info.activity_id}:{info.attempt}"


RATE_LIMITED = "ProviderRateLimited"
# Retryable failures that mean the endpoint is down; past 10 minutes (30 for local endpoints)
# of them the step gives up and the turn parks (SPEC §9).
OUTAGE_TYPES = frozenset({"ProviderServerError", "ProviderUnavailable", "ProviderTimeout",
                          "ProviderUnreachable", "ProviderBadResponse"})  # fmt: skip
OUTAGE_AFTER = timedelta(minutes=10)
OUTAGE_AFTER_LOCAL = timedelta(minutes=30)


def outage_after(step: LlmStepInput) -> timedelta:
    return OUTAGE_AFTER_LOCAL if step.model.is_local() else OUTAGE_AFTER


def _outage_long(step: LlmStepInput) -> bool:
    """The step has been failing since its first attempt for longer than its outage time."""
    first = activity.info().scheduled_time
    return datetime.now(UTC) - first >= outage_after(step)


class LlmActivities:
    """The LLM activities, holding the clients they share."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        secrets: SecretStore,
        pool: AsyncConnectionPool[Conn],
        prices: PriceTable | None = None,
        limits: RateLimits | None = None,
        *,
        endpoints: LlmEndpoints,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.http = http
        self.secrets = secrets
        self.endpoints = endpoints
        self.pool = pool
        self.prices = prices or PriceTable()
        self.limits = limits or RateLimits()
        self.heartbeat_s = heartbeat_s
        self.transcripts = transcripts.RecentMessages()

    @activity.defn(name=names.ACT_LLM_STEP)
    async def llm_step(self, step: LlmStepInput) -> LlmStepOutput:
        """One model call; provider errors arrive as classified ApplicationErrors."""
        provider_label = step.model.provider if step.model.provider in KNOWN_PROVIDERS else "other"
        class_label = f"c{step.klass}"
        info = activity.info()
        waited = (info.started_time - info.current_attempt_scheduled_time).total_seconds()
        SLOT_WAIT.labels(class_label).observe(max(waited, 0.0))
        credential = credential_of(step.model)
        async with self.pool.connection() as conn:  # one checkout: transcript, bucket, ledger
            step = await self.transcripts.resolve(conn, step)
            key, estimate = spend_key(info), self.prices.estimate(step)
            await self._take_tokens(conn, step, credential)
            await self._reserve(conn, step, key, estimate)
        started = time.monotonic()
        outcome = "retry"  # an unexpected exception is retried by Temporal
        try:
            provider = provider_for(step.model, self.endpoints, self.secrets, self.http)
            out = await self._heartbeating(provider.complete(step, info.attempt))
            outcome = "ok"
        except ApplicationError as exc:
            outcome = "error" if exc.non_retryable else "retry"
            # The provider answered with an error (nothing billed) or was never reached.
            await self._settle(key, Decimal(0), released=True)
            if exc.type == RATE_LIMITED:
                await self._rate_limited(exc, credential, step.klass)
            if not exc.non_retryable and exc.type in OUTAGE_TYPES and _outage_long(step):
                raise ApplicationError(
                    f"{names.PROVIDER_OUTAGE}: failing for over {outage_after(step)} ({exc})",
                    type=names.PROVIDER_OUTAGE, non_retryable=True,
                    category=ApplicationErrorCategory.BENIGN,
                ) from exc  # fmt: skip
            raise
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                outcome = "cancelled"
            # Broken off mid-call: it may have been billed, so the estimate stands as spent.
            await self._settle(key, estimate)
            raise
        finally:
            elapsed = time.monotonic() - started
            OPERATION_DURATION.labels(provider_label, class_label, outcome).observe(elapsed)
        cost = self.prices.cost(step.model, out.input_tokens, out.output_tokens)
        await self._settle(key, cost, out.input_tokens, out.output_tokens)
        TOKEN_USAGE.labels("input", provider_label, class_label).observe(out.input_tokens)
        TOKEN_USAGE.labels("output", provider_label, class_label).observe(out.output_tokens)
        log.info(
            "llm step %s#%d (%s, %s %s): %s, %d+%d tokens, %d tool calls, %.2f s",
            step.turn_id, step.step, class_label, step.model.provider, step.model.name,
            out.finish_reason, out.input_tokens, out.output_tokens,
            len(out.message.tool_calls), elapsed,
        )  # fmt: skip
        return out

    async def _take_tokens(self, conn: Conn, step: LlmStepInput, credential: str) -> None:
        """A request and the step's tokens from its credential's bucket; else the attempt ends
        at once and is retried after the wait (BENIGN: no worker slot is held meanwhile)."""
        tokens = prompt_tokens(step) + step.max_tokens
        wait = await buckets.take(conn, self.limits, credential, step.klass, tokens,
                                  datetime.now(UTC))  # fmt: skip
        if wait > 0:
            RATE_WAITS.labels(f"c{step.klass}").inc()
            raise ApplicationError(
                f"CredentialRateLimited: credential {credential!r} has no room for {wait:.1f} s",
                {"wait_s": wait}, type="CredentialRateLimited",
                category=ApplicationErrorCategory.BENIGN,
                next_retry_delay=timedelta(seconds=max(wait, 1.0)),
            )  # fmt: skip

    async def _rate_limited(self, exc: ApplicationError, credential: str, klass: int) -> None:
        """A 429 drains the class's bucket; with Retry-After it pauses the credential for
        every class."""
        details = exc.details[0] if exc.details and isinstance(exc.details[0], dict) else {}
        retry_after = details.get("retry_after_s")
        async with self.pool.connection() as conn:
            await buckets.rate_limited(conn, self.limits, credential, klass, retry_after,
                                       datetime.now(UTC))  # fmt: skip

    async def _reserve(self, conn: Conn, step: LlmStepInput, key: str, estimate: Decimal) -> None:
        """Reserve the step's estimate; a refused budget ends the attempt, never retried."""
        model = f"{step.model.provider}/{step.model.name}"
        r = Reservation(key, step.employee, step.turn_id, step.klass, model, estimate)
        try:
            await ledger.reserve(conn, r)
        except (BudgetExceeded, BudgetHeld) as exc:
            raise ApplicationError(
                str(exc), type=type(exc).__name__, non_retryable=True,
                category=ApplicationErrorCategory.BENIGN,
            ) from None  # fmt: skip

    async def _settle(self, key: str, actual: Decimal, input_tokens: int = 0,
                      output_tokens: int = 0, *, released: bool = False) -> None:  # fmt: skip
        # Shielded: a cancelled attempt still settles what it reserved.
        async def settle() -> None:
            async with self.pool.connection() as conn:
                await ledger.settle(conn, key, actual, input_tokens, output_tokens,
                                    released=released)  # fmt: skip

        await asyncio.shield(settle())

    async def _heartbeating(self, work: Coroutine[Any, Any, T]) -> T:
        """Await `work`, heartbeating meanwhile: heartbeats carry cancellation to the activity."""
        task = asyncio.create_task(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self._heartbeat_interval())
                if done:
                    return task.result()
                activity.heartbeat()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _heartbeat_interval(self) -> float:
        # At most half the heartbeat timeout, so one late beat never times the attempt out.
        timeout = activity.info().heartbeat_timeout
        if timeout:
            return min(self.heartbeat_s, timeout.total_seconds() / 2)
        return self.heartbeat_s
