"""Read-side backpressure per channel account (SPEC §15: customer chats, 5,000 per account,
never dropped; the driver stops reading or answers 429).

An account's backlog is its customer inputs not yet consumed: accepted rows not yet routed
plus open deliveries (pending, held, delivered) of the live generations reading it, counted up
to one past the bound (a bounded, indexed query). Past the bound a reader whose provider keeps
what it was not asked for (Telegram 24 h, the IMAP mailbox) stops reading, and a webhook
answers 429 with Retry-After (the provider sends again); reading resumes below 90 % of the
bound. Each pause raises `channel_backpressure` (ref the account: one open item per account, on
the first employee reading it by name), resolved when the account reads or accepts again.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.runtime.metrics import CHANNEL_BACKPRESSURE

log = logging.getLogger(__name__)
RESUME_SHARE = 0.9  # a paused account reads again below this share of its bound


async def account_backlog(conn: Conn, source: str, bound: int) -> int:
    """The account's unconsumed inputs, counted up to `bound + 1`."""
    cur = await conn.execute(Q["channel_backlog"], {"source_key": source, "cap": bound + 1})
    row = await cur.fetchone()
    return int(row["n"]) if row is not None else 0


def resume_below(bound: int) -> int:
    """The backlog under which a paused account reads again."""
    return max(1, math.floor(bound * RESUME_SHARE))


async def raise_pause(conn: Conn, source: str, driver: str, backlog: int, bound: int,
                      action: str) -> None:  # fmt: skip
    """Raise (or count again) the account's `channel_backpressure` item, log and count it."""
    verb = {"paused": "reading is paused", "refused": "its webhook answers 429",
            "over": "its gateway cannot hold them, so reading goes on"}[action]  # fmt: skip
    detail = (f"channel {source} holds {backlog} unconsumed inputs (bound {bound}): {verb} "
              f"until it is under {resume_below(bound)}; nothing is dropped")  # fmt: skip
    await conn.execute(Q["channel_item_raise"], {
        "id": source, "kind": names.ATTENTION_CHANNEL_BACKPRESSURE, "severity": "warning",
        "detail": detail,
    })  # fmt: skip
    CHANNEL_BACKPRESSURE.labels(driver, action).inc()
    log.warning("%s", detail)


async def resolve_pause(conn: Conn, source: str) -> None:
    """The account reads (or accepts) again: its item resolved."""
    ref = {"kind": names.ATTENTION_CHANNEL_BACKPRESSURE, "ref": source}
    await conn.execute(Q["attention_resolve"], ref)


@dataclass
class Gate:
    """One account's pause, with hysteresis: closed at the bound, open again below 90 %."""

    bound: int
    paused: bool | None = None  # not yet known (the first count decides)

    def room(self, backlog: int) -> int:
        """How many inputs may be read now (0: paused); moves the pause state."""
        if self.paused is None:
            self.paused = backlog >= self.bound
        elif self.paused and backlog < resume_below(self.bound):
            self.paused = False
        elif not self.paused and backlog >= self.bound:
            self.paused = True
        return 0 if self.paused else self.bound - backlog
