"""The supervision items' actions, as `POST /v1/attention/{id}:act` takes them: `release` on a
`thread_quarantined` item, `clear` on an `employee_degraded` item. Database only (I2): the
relay's next supervision pass wakes the entities."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict, NotFound
from eventos.health import degraded, intensity

ACTIONS: Final = {
    names.ACTION_RELEASE: names.ATTENTION_THREAD_QUARANTINED,
    names.ACTION_CLEAR: names.ATTENTION_EMPLOYEE_DEGRADED,
}


async def act(conn: Conn, item_id: int, action: str, audience: str | None = None,
              now: datetime | None = None) -> dict[str, Any]:  # fmt: skip
    """Take `action` on item `item_id` (`audience`: a user's, who may act on their own items
    only; None: the admin). NotFound, or Conflict when the item offers no such action or is
    not open."""
    cur = await conn.execute(Q["health_item_get"], {"id": item_id})
    item = await cur.fetchone()
    if item is None or (audience is not None and item["audience"] != audience):
        raise NotFound(f"no attention item {item_id}")
    if item["kind"] != ACTIONS.get(action) or item["action"] != action:
        raise Conflict(f"attention item {item_id} offers no {action!r}")
    if item["state"] == "resolved":
        raise Conflict(f"attention item {item_id} is {item['state']}")
    if action == names.ACTION_RELEASE:
        return await intensity.release(conn, item)
    return await degraded.clear(conn, item, now or datetime.now(UTC))


async def release_thread(conn: Conn, item: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """`release` as an entry of an action table taking (conn, item, body)."""
    return await intensity.release(conn, item)


async def clear_degraded(conn: Conn, item: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """`clear` as an entry of an action table taking (conn, item, body)."""
    return await degraded.clear(conn, item, datetime.now(UTC))
