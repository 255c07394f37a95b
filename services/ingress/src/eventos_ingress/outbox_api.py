"""The owner API's outbox (SPEC §11, §17): what left or waits to leave, and Retry.

`GET /v1/outbox` lists rows newest first (filters `status`, `employee`; `before` an id for
the next page); a row never shows its recipient or its body. `POST /v1/outbox/{id}:retry`
queues an `unknown` or `failed` send once more: the owner checked that it did not arrive, and
the egress sends it once. Admin token only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import InputInvalid, NotFound
from eventos.outbox import egress

STATUSES = ("held", "queued", "sending", "sent", "failed", "unknown", "expired")
PAGE_DEFAULT = 50
PAGE_MAX = 200


def _view(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


def _int_param(request: Request, key: str, default: int | None, high: int) -> int | None:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    # The length first: a longer number is out of range whatever its digits (its first 19 alone
    # passed the check, and PostgreSQL refused the bigint: a 500 the fuzz test found).
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or not 0 < int(raw) <= high:
        raise InputInvalid(key, f"must be an integer in 1..{high}")
    return int(raw)


@dataclass
class OutboxApi:
    pool: AsyncConnectionPool[Conn]

    async def list(self, request: Request, caller: object) -> Response:
        """The outbox, newest first: `?status=unknown&employee=NAME&before=ID&limit=N`."""
        status = request.query_params.get("status")
        if status is not None and status not in STATUSES:
            raise InputInvalid("status", f"must be one of {', '.join(STATUSES)}")
        limit = _int_param(request, "limit", PAGE_DEFAULT, PAGE_MAX)
        params = {"status": status, "employee": request.query_params.get("employee"),
                  "audience": None, "limit": limit,
                  "before": _int_param(request, "before", None, 2**63 - 1)}  # fmt: skip
        async with self.pool.connection() as conn:
            cur = await conn.execute(Q["outbound_list"], params)
            rows = [_view(dict(r)) for r in await cur.fetchall()]
        following = rows[-1]["id"] if limit is not None and len(rows) == limit else None
        return JSONResponse({"outbox": rows, "next_before": following})

    async def retry(self, request: Request, caller: object) -> Response:
        """`{id}:retry`: an `unknown` or `failed` send queued once more (202)."""
        target, _, verb = str(request.path_params["target"]).partition(":")
        if verb != "retry" or not (target.isascii() and target.isdigit()) or len(target) > 18:
            raise NotFound("use POST /v1/outbox/<id>:retry")
        async with self.pool.connection() as conn:
            row = await egress.request_retry(conn, int(target))
        return JSONResponse({"id": row["id"], "status": "queued", "retry": True}, status_code=202)
