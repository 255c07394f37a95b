"""Bench and test hook: fill an employee's timeline quickly (one statement, ~1 s per 100,000
rows) with the mix of entries real traffic writes, so a page can be timed on a large timeline
(issue 16's measure: 100 employees, 100,000 timeline rows)."""

from __future__ import annotations

from eventos.db import Conn
from eventos.db.sql import Q

WEEK_S = 7 * 86400
# One statement, ~1 s per 100,000 rows on a quiet machine; the pool's 5 s statement timeout
# cut it on a loaded one (a suite beside a fault run), so the load has a bound of its own.
LOAD_TIMEOUT_MS = 300_000


async def bulk_timeline(conn: Conn, employee: str, rows: int, *, spread_s: float = WEEK_S,
                        threads: int = 40) -> None:  # fmt: skip
    """Add `rows` entries to `employee`'s timeline, evenly over the last `spread_s` seconds
    (per input: accepted, routed, delivered; per turn: started, done; its reply queued and
    sent), over `threads` threads, each input its own chain `bulk-<employee>-<n>`."""
    params = {"employee": employee, "rows": rows, "spread_s": spread_s, "threads": threads}
    async with conn.transaction():
        await conn.execute(Q["statement_timeout_local"], {"ms": str(LOAD_TIMEOUT_MS)})
        await conn.execute(Q["timeline_bulk_load"], params)
