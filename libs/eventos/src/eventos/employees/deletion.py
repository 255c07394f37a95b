"""Delete an employee (issue 26 point 6): the database side, one transaction.

Only an employee with no *live* generation may go: `starting` and `running` are live (they
take turns); `paused` (stopped, by the owner or its budget) is not, nor `retired`, nor none at
all. A paused generation is retired on the way out exactly as Reset retires it (its unconsumed
inputs `dead(reset)`, its alarms and delegations cancelled) with a Reset intent, so its
supervisor, Schedules, polls and conversations close in Temporal too (I2).

The employee row stays as a tombstone (`deleted_at`): lists, lookups, chat and lifecycle
actions no longer see it; its webhook paths are released now, and its channel accounts,
drivers and other sources were held only by a live generation's subscriptions, so another
employee may claim any of them. Its history (timeline, turns, transcripts, chat messages, dead
letters) stays readable by name until each table's retention removes it. Applying the name
again makes a fresh employee (`employee_upsert`) whose first Start takes the generation number
after the old ones, so no workflow id, stream or conversation of the old history is reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.employees import intents, lifecycle
from eventos.errors import Conflict, NotFound

LIVE_STATES = (names.GEN_STARTING, names.GEN_RUNNING)


@dataclass(frozen=True)
class Deleted:
    """What delete did: when, and the Reset intent of a paused generation it retired."""

    name: str
    deleted_at: datetime
    retired_generation: int | None
    intent: dict[str, Any] | None


async def delete(conn: Conn, name: str) -> Deleted:
    """Delete an employee with no live generation; Conflict (saying to stop it first) else."""
    async with conn.transaction():
        live = await lifecycle.live_locked(conn, name)  # NotFound for an unknown or deleted one
        if live is not None and live.state in LIVE_STATES:
            raise Conflict(
                f"{name!r} generation {live.generation} is {live.state}: stop it first "
                f"(`eventosctl stop {name}` or POST /v1/employees/{name}:stop), then delete"
            )
        intent = None
        if live is not None:  # paused: retired as Reset does, and told to Temporal
            intent = (await intents.request(conn, name, names.INTENT_RESET)).intent
        await conn.execute(Q["employee_webhook_paths_release"], {"employee": name})
        await conn.execute(Q["employee_health_forget"], {"employee": name})
        cur = await conn.execute(Q["employee_mark_deleted"], {"name": name})
        row = await cur.fetchone()
        if row is None:
            raise NotFound(f"no employee named {name!r}")
        generation = None if live is None else live.generation
        await conn.execute(Q["employee_deleted_event"],
                           {"employee": name, "generation": generation})  # fmt: skip
    return Deleted(name, row["deleted_at"], generation, intent)
