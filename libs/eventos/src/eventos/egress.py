"""Egress (SPEC §11): claim an outbox row by compare-and-swap, deliver it, mark it sent.

Owner chat is the first channel: the reply is written to `chat_events` (once per outbox row,
so a retried send cannot show it twice) and the owner's event stream picks it up.

The recipient is sealed at rest (`eventos.outbox_keys`) and opened only here, when a sender
needs it. One that does not open fails its row (nothing was sent) with an attention item: a
data error of one row, never an outage.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import NotFound, RecipientUnreadable
from eventos.metrics import EGRESS_LATENCY
from eventos.outbox_keys import OutboxKeys, Sealed

SENT = "sent"
FAILED = "failed"
log = logging.getLogger(__name__)


def recipient_of(row: dict[str, Any], keys: OutboxKeys) -> str | None:
    """The row's recipient in the clear (None when it has none)."""
    if row["recipient"] is None:
        return None
    sealed = Sealed(str(row["recipient_key_id"]), bytes(row["recipient"]))
    return keys.open(sealed, employee=row["employee"], idempotency_key=row["idempotency_key"])


async def _fail_unreadable(conn: Conn, row: dict[str, Any], exc: RecipientUnreadable) -> str:
    await conn.execute(Q["outbound_fail"], {"id": row["id"]})
    await conn.execute(Q["attention_raise"], {
        "employee": row["employee"], "kind": names.ATTENTION_RECIPIENT_UNREADABLE,
        "severity": "error", "ref": f"outbox#{row['id']}",
        "detail": f"outbox row {row['id']} was not sent: {exc}"[:1000],
    })  # fmt: skip
    log.error("outbox row %d failed unsent: %s", row["id"], exc)
    return FAILED


async def send(conn: Conn, outbound_id: int, keys: OutboxKeys) -> str:
    """Deliver one outbox row; returns its final status."""
    token = uuid.uuid4().hex
    started = time.monotonic()
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
        if row["kind"] != names.KIND_CHAT:
            # No sender for this channel yet: the claim is undone and the row waits, queued.
            await conn.execute(Q["outbound_unclaim"], {"id": outbound_id})
            log.warning("outbox row %d waits: no sender for %r yet", outbound_id, row["kind"])
            return "queued"
        try:
            session = recipient_of(row, keys) or "owner"
        except RecipientUnreadable as exc:
            return await _fail_unreadable(conn, row, exc)
        await conn.execute(Q["chat_reply_insert"], {
            "employee": row["employee"], "session": session,
            "outbound_id": outbound_id, "turn_id": row["turn_id"], "text": row["body"],
        })  # fmt: skip
        await conn.execute(Q["outbound_sent"], {"id": outbound_id})
    # From the row's write (by the database's clock) to the committed send.
    EGRESS_LATENCY.labels(str(row["kind"])).observe(
        float(row["age_s"]) + time.monotonic() - started
    )
    return SENT
