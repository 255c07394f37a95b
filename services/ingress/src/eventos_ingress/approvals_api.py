"""The owner API's approvals (SPEC §11, §17): what waits for a decision, and the decision.

`GET /v1/approvals` lists approvals newest first (`state`, `employee` filters) with each held
draft; `GET /v1/approvals/{id}` shows one; `POST /v1/approvals/{id}:approve|:decline` writes the
decision (202) with an intent that nudges its workflow (I2: no request calls Temporal). The
admin sees and decides every approval; a user only those a rule handed to it (`decided_by:
user`) in its own chat: every other hold, its own chat's included, is a 404 to it (its chat
only says the reply is held for review).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from eventos import names
from eventos.db import Conn
from eventos.errors import InputInvalid, NotFound
from eventos.outbox import approvals
from eventos.runtime.wake import Kicker

STATES = (names.APPROVAL_PENDING, names.APPROVAL_APPROVED, names.APPROVAL_DECLINED,
          names.APPROVAL_EXPIRED)  # fmt: skip
VERBS = {"approve": names.APPROVAL_APPROVED, "decline": names.APPROVAL_DECLINED}
PAGE_MAX = 200


class Caller(Protocol):
    """Who calls (the owner API's Caller): their audience, and whether they are the admin."""

    @property
    def audience(self) -> str: ...

    @property
    def admin(self) -> bool: ...

    @property
    def since(self) -> datetime | None: ...


@dataclass
class ApprovalsApi:
    pool: AsyncConnectionPool[Conn]
    kicker: Kicker | None = None

    async def list(self, request: Request, caller: Caller) -> Response:
        """Approvals newest first: `?state=pending&employee=NAME`."""
        state = request.query_params.get("state")
        if state is not None and state not in STATES:
            raise InputInvalid("state", f"must be one of {', '.join(STATES)}")
        async with self.pool.connection() as conn:
            rows = await approvals.listed(
                conn, audience=caller.audience, admin=caller.admin, state=state,
                employee=request.query_params.get("employee"), limit=PAGE_MAX,
                since=caller.since,
            )  # fmt: skip
        return JSONResponse({"approvals": rows})

    async def get(self, request: Request, caller: Caller) -> Response:
        """One approval with its held draft."""
        async with self.pool.connection() as conn:
            row = await approvals.get(conn, str(request.path_params["approval_id"]),
                                      audience=caller.audience, admin=caller.admin,
                                      since=caller.since)  # fmt: skip
        return JSONResponse(row)

    async def decide(self, request: Request, caller: Caller) -> Response:
        """`{id}:approve` or `{id}:decline`: the decision, committed; its workflow is nudged."""
        ident, _, verb = str(request.path_params["target"]).rpartition(":")
        if not ident or verb not in VERBS:
            raise NotFound("use POST /v1/approvals/<id>:approve or :decline")
        async with self.pool.connection() as conn:
            row: dict[str, Any] = await approvals.decide(
                conn,
                ident,
                VERBS[verb],
                by=caller.audience,
                admin=caller.admin,
                since=caller.since,
            )
        if self.kicker is not None:
            self.kicker.kick()
        return JSONResponse(row, status_code=202)
