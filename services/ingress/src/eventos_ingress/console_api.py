"""The owner API's reads for the web console (issue 16), each one bounded page:

- `GET /v1/me`: who the token is (its audience, admin or not) and the employees it may chat with;
- `GET /v1/counts`: what waits for the caller, for the console's navigation (attention items
  open, approvals pending, outbox rows `unknown`);
- `GET /v1/employee-summaries`: employees with state, generation, budget, pending inputs by
  class and open attention items (admin);
- `GET /v1/employees/{name}/conversations` and `.../turns` (turns with their steps and cost;
  admin), `.../turns/{turn_id}` (one turn);
- `GET /v1/employees/{name}/turns/{turn_id}/transcript`: what the model was asked and answered
  in a turn (admin only, and only with `EVENTOS_CONSOLE_TRANSCRIPTS` on; each view is recorded
  on the employee's timeline);
- `GET /v1/employees/{name}/chat`: the caller's own messages in a session with their replies,
  and the event id its live stream goes on from.

Lists answer `{"<plural>": [...], "next_cursor": ...}` and take `?limit=` (default 50, max 200)
and `?cursor=`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from eventos import names
from eventos.console import reads, transcripts
from eventos.console.settings import TRANSCRIPTS_VAR, ConsoleSettings
from eventos.db import Conn
from eventos.errors import Forbidden, InputInvalid

PAGE_DEFAULT = 50
PAGE_MAX = 200
SESSION_MAX = 64
THREAD_MAX = 200
TURN_ID_MAX = 600
TRANSCRIPTS_OFF = (f"transcript views are off on this instance: set {TRANSCRIPTS_VAR}=1 in the "
                   "ingress's environment and restart it to turn them on")  # fmt: skip


class Caller(Protocol):
    """Who calls (the owner API's Caller): their audience, and whether they are the admin."""

    @property
    def audience(self) -> str: ...

    @property
    def admin(self) -> bool: ...

    @property
    def since(self) -> datetime | None: ...


def limit_of(request: Request) -> int:
    """`?limit=`: 1 to 200, 50 when absent."""
    raw = request.query_params.get("limit")
    if raw is None:
        return PAGE_DEFAULT
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw[:4]) <= PAGE_MAX:
        raise InputInvalid("limit", f"must be an integer in 1..{PAGE_MAX}")
    return int(raw)


def _text(request: Request, key: str, high: int) -> str | None:
    value = request.query_params.get(key)
    if value is not None and not 0 < len(value) <= high:
        raise InputInvalid(key, f"must be 1 to {high} characters")
    return value


def _turn_id(request: Request) -> str:
    value = str(request.path_params["turn_id"])
    if not 0 < len(value) <= TURN_ID_MAX:
        raise InputInvalid("turn_id", f"must be 1 to {TURN_ID_MAX} characters")
    return value


def _page(key: str, page: reads.Page) -> Response:
    return JSONResponse({key: page.rows, "next_cursor": page.next_cursor})


@dataclass
class ConsoleApi:
    pool: AsyncConnectionPool[Conn]
    settings: ConsoleSettings = field(default_factory=ConsoleSettings)

    async def me(self, request: Request, caller: Caller) -> Response:
        """Who this token is, and the employees it may chat with."""
        async with self.pool.connection() as conn:
            employees = await reads.chat_employees(conn)
        return JSONResponse({"name": caller.audience, "admin": caller.admin, "chat": employees})

    async def counts(self, request: Request, caller: Caller) -> Response:
        """What waits for the caller, counted (its own audience's unless admin)."""
        async with self.pool.connection() as conn:
            found = await reads.counts(conn, caller.audience, caller.admin, caller.since)
        return JSONResponse(found)

    async def summaries(self, request: Request, caller: Caller) -> Response:
        """Employees by name with what the console's employees page shows."""
        after, limit = request.query_params.get("cursor"), limit_of(request)
        async with self.pool.connection() as conn:
            page = await reads.employee_summaries(conn, after, limit)
        return _page("employee_summaries", page)

    async def conversations(self, request: Request, caller: Caller) -> Response:
        """An employee's conversations, newest generation first."""
        after, limit = request.query_params.get("cursor"), limit_of(request)
        async with self.pool.connection() as conn:
            page = await reads.conversations(conn, request.path_params["name"], after, limit)
        return _page("conversations", page)

    async def turns(self, request: Request, caller: Caller) -> Response:
        """An employee's turns newest first (`?thread=`), with their steps and cost."""
        after, limit = request.query_params.get("cursor"), limit_of(request)
        thread = _text(request, "thread", THREAD_MAX)
        async with self.pool.connection() as conn:
            page = await reads.turns(conn, request.path_params["name"], thread, after, limit)
        return _page("turns", page)

    async def turn(self, request: Request, caller: Caller) -> Response:
        """One turn of an employee with its steps (durations, attempts), cost and error."""
        turn_id = _turn_id(request)
        async with self.pool.connection() as conn:
            found = await reads.turn(conn, request.path_params["name"], turn_id)
        return JSONResponse(found)

    async def transcript(self, request: Request, caller: Caller) -> Response:
        """What the model was asked and answered in a turn (admin; opt-in); the view is
        recorded on the employee's timeline."""
        if not caller.admin:  # the route is the admin's already; never a user's, whatever
            raise Forbidden("only the admin token may read a transcript")
        if not self.settings.transcripts:
            raise Forbidden(TRANSCRIPTS_OFF)
        turn_id = _turn_id(request)
        async with self.pool.connection() as conn:
            doc = await transcripts.read(conn, request.path_params["name"], turn_id,
                                         caller.audience)  # fmt: skip
        return JSONResponse(
            doc, headers={"Cache-Control": "no-store"}
        )  # message text: kept nowhere

    async def chat_history(self, request: Request, caller: Caller) -> Response:
        """The caller's messages in a session newest first, each with its reply."""
        before, limit = request.query_params.get("cursor"), limit_of(request)
        session = _text(request, "session", SESSION_MAX) or names.DEFAULT_SESSION
        async with self.pool.connection() as conn:
            found = await reads.chat_history(conn, request.path_params["name"],
                                             caller.audience, session, before, limit,
                                             caller.since)  # fmt: skip
        body = {"messages": found.page.rows, "next_cursor": found.page.next_cursor,
                "last_event_id": found.last_event_id}  # fmt: skip
        return JSONResponse(body)
