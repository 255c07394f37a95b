"""The reconcile every restore runs (RFC-0005 §21.3): the restored database is the truth (I1,
I10), and Temporal is made to agree with it.

1. In the restored database, before it goes live: turns it shows running are orphaned (their
   runs belong to a Temporal that moved on) and fail; every stream's inputs sent to its entity
   but not consumed return to pending; and the send keys survive: every channel send the live
   database made (or may have made) since the backup is carried over under its idempotency
   key, so the turn that runs again for the same inputs finds its reply already sent.
2. In Temporal, once the restored database is live: every run of the instance's namespace is
   terminated and its Schedules deleted, as if Temporal were emptied (EG13): a running entity
   would otherwise drop the returned inputs as already seen.
3. The re-arm of EG13 (an intent the relay applies) starts each live generation's supervisor
   again from the database, which sets its Schedules and alarms again; replies the database
   holds unsent go to the egress under their own send keys, so nothing goes twice.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb
from temporalio.service import RPCError, RPCStatusCode

from eventos import names
from eventos.db import Conn, connect
from eventos.db.sql import Q
from eventos.employees import intents
from eventos.errors import EventOSError
from eventos.runtime.payload_guard import connect as temporal_connect
from eventos.scheduling import admission
from eventos.scheduling.policy import SchedConfig
from eventos.settings import DatabaseSettings, TemporalSettings

RUNS_MAX = 100_000  # runs a restore terminates at most (an instance has far fewer)
CALL_TIMEOUT = timedelta(seconds=10)
REARM_POLL_S = 0.25
CONNECT_RETRY_S = 0.5  # how often a restore tries a Temporal server not answering yet


class ReconcileFailed(EventOSError):
    """The reconcile after a restore failed."""


@dataclass(frozen=True)
class ReconcileReport:
    """What a restore's reconcile did."""

    turns_failed: int = 0
    sends_kept: int = 0
    deliveries_pending: int = 0
    streams: int = 0
    runs_terminated: int = 0
    schedules_deleted: int = 0
    rearm_intent: int | None = None
    rearm: str = ""  # the re-arm's outcome, or why it is not known yet

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


async def reconcile_database(conn: Conn, reason: str) -> tuple[int, int, int]:
    """Step 1 on the restored database: (turns failed, deliveries pending again, streams)."""
    failed = pending = streams = 0
    cur = await conn.execute(Q["turns_running_all"])
    for turn in await cur.fetchall():
        changed, _ = await admission.release(
            conn, SchedConfig(), turn["id"], names.TURN_FAILED, reason
        )
        failed += changed
    cur = await conn.execute(Q["restore_streams_sent"])
    for stream in await cur.fetchall():
        async with conn.transaction():
            back = await conn.execute(Q["stream_redeliver"], {"stream_key": stream["stream_key"]})
            row = await back.fetchone()
        pending += int(row["redelivered"]) if row else 0
        streams += 1
    return failed, pending, streams


async def keep_sends(live: Conn, restored: Conn, since: datetime) -> int:
    """Carry the live database's channel sends changed since `since` into the restored one;
    how many were added or settled there."""
    cur = await live.execute(Q["restore_sends_made"], {"since": since})
    kept = 0
    for send in await cur.fetchall():
        done = await restored.execute(Q["restore_send_keep"], {"row": Jsonb(send["row"])})
        kept += done.rowcount
    return kept


async def clear_temporal(
    settings: TemporalSettings, reason: str, deadline_s: float
) -> tuple[int, int]:
    """Step 2: terminate every running run of the namespace and delete its Schedules;
    (runs terminated, schedules deleted)."""

    async def clear() -> tuple[int, int]:
        client = await temporal_connect(settings.address, settings.namespace)
        runs = schedules = 0
        async for wf in client.list_workflows(
            'ExecutionStatus="Running"', limit=RUNS_MAX, rpc_timeout=CALL_TIMEOUT
        ):
            try:
                await client.get_workflow_handle(wf.id, run_id=wf.run_id).terminate(
                    reason=reason, rpc_timeout=CALL_TIMEOUT
                )
                runs += 1
            except RPCError as exc:  # it ended meanwhile
                if "not found" not in str(exc).lower() and "completed" not in str(exc).lower():
                    raise
        async for sched in await client.list_schedules(rpc_timeout=CALL_TIMEOUT):
            await client.get_schedule_handle(sched.id).delete(rpc_timeout=CALL_TIMEOUT)
            schedules += 1
        return runs, schedules

    async def until_cleared() -> tuple[int, int]:
        # At tier L the server was just started again on the restored databases: it is waited
        # for (refused connections, a namespace its frontend does not serve yet).
        while True:
            try:
                return await clear()
            except (RPCError, RuntimeError) as exc:
                if not _not_up_yet(exc):
                    raise
            await asyncio.sleep(CONNECT_RETRY_S)

    try:
        return await asyncio.wait_for(until_cleared(), deadline_s)
    except TimeoutError:
        raise ReconcileFailed(
            f"Temporal at {settings.address} (namespace {settings.namespace}) "
            f"was not cleared within {deadline_s:g} s (is its server running?)"
        ) from None
    except (RPCError, RuntimeError) as exc:
        raise ReconcileFailed(
            f"Temporal at {settings.address} (namespace {settings.namespace}): {exc}"
        ) from None


def _not_up_yet(exc: Exception) -> bool:
    """Whether `exc` says the server is not answering yet, rather than refusing the call."""
    if isinstance(exc, RPCError):
        return exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.NOT_FOUND)
    return True  # the client's connect failed


async def rearm(url: str, wait_s: float) -> tuple[int, str]:
    """Step 3: ask the relay to re-arm (an intent), and wait up to `wait_s` for its outcome;
    (the intent's id, its outcome or that it is still applying)."""
    async with await connect(DatabaseSettings(url=url), autocommit=True) as conn:
        intent = await intents.rearm(conn)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            row = await intents.get(conn, int(intent["id"]))
            if row["state"] != "applying":
                return int(intent["id"]), f"{row['state']}: {row.get('outcome') or ''}".strip()
            if loop.time() > deadline:
                return int(intent["id"]), (
                    f"asked; not applied within {wait_s:g} s (the relay applies it when it runs)"
                )
            await asyncio.sleep(REARM_POLL_S)
