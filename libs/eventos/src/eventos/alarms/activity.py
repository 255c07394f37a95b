"""The supervisor's alarm activity (workers-workflow) and the `alarms_changed` hint.

`fire_due_alarms` fires what is due for a running generation and answers the earliest
scheduled alarm left, the supervisor's `alarms` deadline. A paused generation's alarms wait
(they fire on Resume, late, with their `if_late` rule); a retired one's were cancelled.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from eventos import names
from eventos.alarms import store
from eventos.contracts import AlarmsDue, FireAlarms
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.settings import AlarmSettings

log = logging.getLogger(__name__)
SIGNAL_TIMEOUT = timedelta(seconds=10)


async def signal_changed(client: Client, employee: str, generation: int) -> None:
    """Tell the generation's supervisor its alarms changed (after the change committed). A
    supervisor that is not running reads the database on its next start; an unreachable
    Temporal raises, so the caller's activity retries (the Signal is a hint, I1, and the
    supervisor re-reads within the hour anyway)."""
    handle = client.get_workflow_handle(names.supervisor_id(employee, generation))
    try:
        await handle.signal(names.SIGNAL_ALARMS_CHANGED, rpc_timeout=SIGNAL_TIMEOUT)
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise


class AlarmActivities:
    """`fire_due_alarms` on the workflow queue."""

    def __init__(self, pool: AsyncConnectionPool[Conn], settings: AlarmSettings | None = None):
        self.pool = pool
        self.settings = settings or AlarmSettings()

    @activity.defn(name=names.ACT_FIRE_ALARMS)
    async def fire_due_alarms(self, req: FireAlarms) -> AlarmsDue:
        """Fire one batch of due occurrences (one transaction) and answer the earliest
        scheduled one left (still due when the batch was full: the supervisor comes again)."""
        s, e, g = self.settings, req.employee, req.generation
        async with self.pool.connection() as conn:
            cur = await conn.execute(Q["generation_control"], {"employee": e, "generation": g})
            row = await cur.fetchone()
            zone = str((row or {}).get("spec", {}).get("spec", {}).get("timezone", "UTC"))
            done = await store.fire_due(conn, e, g, zone, limit=s.fire_batch,
                                        note_after_s=s.late_note_after_s)  # fmt: skip
            await conn.commit()
            due = await store.next_due(conn, e, g)
        if done.fired or done.missed or done.cancelled:
            log.info("%s g%d: %d alarm(s) fired, %d missed, %d deadline(s) settled by their "
                     "owner", req.employee, req.generation, done.fired, done.missed,
                     done.cancelled)  # fmt: skip
        return AlarmsDue(done.fired, done.missed, due)

    def activities(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.fire_due_alarms]
