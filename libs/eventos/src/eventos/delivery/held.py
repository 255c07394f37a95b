"""What the relay held for a waiting entity, taken when its slot is granted.

An entity queued for a turn slot (`sched_waiters.takes_held`) is sent no input of its class or
below while it waits (relay.sql `stream_claim`): each would cost it a Signal and a workflow
task, and change nothing until the slot comes. When its ask is granted, the answer carries the
stream's inputs after the entity's last applied seq, within one batch's bounds and the window's
room, and those still pending become `delivered` as the relay's commit makes them. The rest,
and whatever comes while the turn runs, the relay sends as before (the entity no longer waits).

The same grant asked again (its answer lost) reads the same inputs again: those it marked
delivered the first time are above the entity's applied seq still. A relay that sent some of
them meanwhile is dropped by the entity (seq <= applied).
"""

from __future__ import annotations

from typing import Any

from eventos import names
from eventos.contracts import DeliveryItem
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.delivery.relay import take_batch


async def take(conn: Conn, stream_key: str, after: int) -> list[DeliveryItem]:
    """The inputs of `stream_key` after `after` for its entity's grant, in seq order: those
    delivered already, then pending ones while the stream has no hold and its window room."""
    async with conn.transaction():
        rows = await _read(conn, stream_key, after)
        if any(r["status"] == "pending" and r["type"] == names.TYPE_TRIGGER_CRON for r in rows):
            # As the relay before it sends a tick (SPEC §15): superseded or stale ones expire.
            ticks = {"subscriptions": [], "stream_keys": [stream_key]}
            if await (await conn.execute(Q["cron_ticks_expire"], ticks)).fetchall():
                rows = await _read(conn, stream_key, after)
        if not rows:
            return []
        # Those delivered already (one batch at most: `_read`'s limit), then the pending ones as
        # the relay batches them, within what is left of the batch and of the window.
        sent = [DeliveryItem.from_row(r) for r in rows if r["status"] == "delivered"]
        pending = [r for r in rows if r["status"] == "pending"]
        size = sum(i.size for i in sent)
        room_inputs = min(
            names.BATCH_MAX_ITEMS - len(sent),
            names.WINDOW_MAX_INPUTS - int(rows[0]["window_inputs"]) - len(sent),
        )
        room_bytes = min(names.BATCH_MAX_BYTES - size,
                         names.WINDOW_MAX_BYTES - int(rows[0]["window_bytes"]) - size)  # fmt: skip
        held = rows[0]["hold_reason"] is not None
        if held or not pending or room_inputs <= 0 or room_bytes < pending[0]["size"]:
            return sent
        taken = take_batch(pending, room_inputs, room_bytes)
        through = taken[-1].seq
        taken_through = {"stream_key": stream_key, "after": after, "through": through}
        await conn.execute(Q["stream_take_delivered"], taken_through)
        return sent + taken


async def _read(conn: Conn, stream_key: str, after: int) -> list[dict[str, Any]]:
    params = {"stream_key": stream_key, "after": after, "limit": names.BATCH_MAX_ITEMS}
    cur = await conn.execute(Q["stream_held"], params)
    return [r for r in await cur.fetchall() if r["seq"] is not None]
