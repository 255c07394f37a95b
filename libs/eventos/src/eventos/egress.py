"""Egress (SPEC §11): claim an outbox row by compare-and-swap, deliver it, mark it sent.

Owner chat is the first channel: the reply is written to `chat_replies` (once per outbox row,
so a retried send cannot show it twice) and the owner's event stream picks it up.
"""

from __future__ import annotations

import logging
import uuid

from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import NotFound

SENT = "sent"
log = logging.getLogger(__name__)


async def send(conn: Conn, outbound_id: int) -> str:
    """Deliver one outbox row; returns its final status."""
    token = uuid.uuid4().hex
    async with conn.transaction():
        cur = await conn.execute(Q["outbound_claim"], {"id": outbound_id, "token": token})
        row = await cur.fetchone()
        if row is None:
            cur = await conn.execute(Q["outbound_get"], {"id": outbound_id})
            row = await cur.fetchone()
            if row is None:
                raise NotFound(f"no outbox row {outbound_id}")
            if row["status"] != "sending":
                return str(row["status"])
            # An attempt broke off after its claim. Owner chat's "provider" is our own table,
            # whose unique outbound_id makes a second write a no-op: finishing is safe.
        if row["kind"] != "chat":
            # No sender for this channel yet: the claim is undone and the row waits, queued.
            await conn.execute(Q["outbound_unclaim"], {"id": outbound_id})
            log.warning("outbox row %d waits: no sender for %r yet", outbound_id, row["kind"])
            return "queued"
        await conn.execute(Q["chat_reply_insert"], {
            "employee": row["employee"], "session": row["recipient"] or "owner",
            "outbound_id": outbound_id, "turn_id": row["turn_id"], "text": row["body"],
        })  # fmt: skip
        await conn.execute(Q["outbound_sent"], {"id": outbound_id})
    return SENT
