"""The owner API under `/v1/` (SPEC §6.2, §17), behind the instance's bearer token."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.schemas import SchemaGenerator

from eventos import chat, employees, intents, names
from eventos.db import Conn
from eventos.errors import (
    Conflict,
    DatabaseUnavailable,
    EventOSError,
    EventRejected,
    NotFound,
    QueueFull,
    SpecInvalid,
)
from eventos.llm.endpoints import LlmEndpoints
from eventos.spec import load_specs
from eventos.wake import Kicker

Handler = Callable[[Request], Awaitable[Response]]
MAX_SPEC_BYTES = 1024 * 1024
SSE_POLL_S = 0.25
SSE_KEEPALIVE_S = 15.0
LIFECYCLE = {*intents.LIFECYCLE, names.INTENT_INTERRUPT}

SCHEMAS = SchemaGenerator(
    {"openapi": "3.0.3", "info": {"title": "Event OS owner API", "version": "1"}}
)


def error_response(exc: Exception) -> Response:
    """Domain error → HTTP answer (translated once, here)."""
    if isinstance(exc, SpecInvalid):
        errors = [{"path": p, "message": m} for p, m in exc.errors]
        return JSONResponse({"error": "invalid spec", "errors": errors}, status_code=400)
    table: list[tuple[type[EventOSError], int]] = [
        (EventRejected, 400), (NotFound, 404), (Conflict, 409), (QueueFull, 429),
        (DatabaseUnavailable, 503),
    ]  # fmt: skip
    for kind, code in table:
        if isinstance(exc, kind):
            headers = {"Retry-After": "5"} if code == 503 else None
            return JSONResponse({"error": str(exc)}, status_code=code, headers=headers)
    raise exc


def _row(row: dict[str, Any]) -> dict[str, Any]:
    intent = None
    if row["intent_id"] is not None:
        intent = {"id": row["intent_id"], "kind": row["intent_kind"], "state": row["intent_state"]}
    return {
        "name": row["name"],
        "spec_sha256": row["spec_sha256"],
        "generation": row["generation"],
        "state": row["state"] or "stopped",
        "pause_reason": row["pause_reason"],
        "revision": row["control_revision"],
        "limits": row["limits"],
        "intent": intent,
    }


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object; an empty body is an empty object."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise EventRejected("body must be JSON") from None
    if not isinstance(doc, dict):
        raise EventRejected("body must be a JSON object")
    return doc


def _requested(req: intents.Requested) -> Response:
    """202: the change is committed; its intent is `applying` until the deliverer applies it."""
    body = {"name": req.employee, "generation": req.generation, "state": req.state,
            "intent": intents.intent_view(req.intent)}  # fmt: skip
    return JSONResponse(body, status_code=202)


@dataclass
class OwnerApi:
    """Handlers of the owner API."""

    pool: AsyncConnectionPool[Conn]
    token: str
    kicker: Kicker | None = None
    endpoints: LlmEndpoints = field(default_factory=LlmEndpoints)  # what apply allows models

    def guarded(self, handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            auth = request.headers.get("authorization", "")
            given = auth.removeprefix("Bearer ").encode()
            if not auth.startswith("Bearer ") or not hmac.compare_digest(
                given, self.token.encode()
            ):
                return JSONResponse({"error": "a valid bearer token is required"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
            try:
                return await handler(request)
            except EventOSError as exc:
                return error_response(exc)

        run.__doc__ = handler.__doc__
        return run

    def routes(self) -> list[BaseRoute]:
        g = self.guarded
        return [
            Route("/v1/employees", g(self.apply), methods=["POST"]),
            Route("/v1/employees", g(self.list), methods=["GET"]),
            Route("/v1/employees/{name}", g(self.get), methods=["GET"]),
            Route("/v1/employees/{name}/chat", g(self.chat), methods=["POST"]),
            Route("/v1/employees/{name}/chat/events", g(self.chat_events), methods=["GET"]),
            Route(
                "/v1/employees/{name}/chat/{message_id:int}", g(self.chat_message), methods=["GET"]
            ),
            Route("/v1/employees/{name}/limits", g(self.limits), methods=["POST"]),
            Route("/v1/employees/{action_path:path}", g(self.lifecycle), methods=["POST"]),
            Route("/v1/intents/{intent_id:int}", g(self.intent), methods=["GET"]),
            Route("/v1/rearm", g(self.rearm), methods=["POST"]),
            Route("/openapi.json", self.openapi, methods=["GET"], include_in_schema=False),
        ]

    async def openapi(self, request: Request) -> Response:
        schema = SCHEMAS.get_schema(self.routes())
        schema["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
        schema["security"] = [{"bearer": []}]
        return JSONResponse(schema)

    async def apply(self, request: Request) -> Response:
        """
        summary: Apply employee specs (YAML or JSON; several YAML documents allowed)
        responses:
          200: {description: applied}
          400: {description: invalid spec; each error names its field path}
          409: {description: a webhook path is already used by another employee}
        """
        body = await request.body()
        if len(body) > MAX_SPEC_BYTES:
            raise EventRejected("spec over 1 MiB")
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise EventRejected("spec must be UTF-8") from None
        if "json" in request.headers.get("content-type", ""):
            try:
                text = yaml.safe_dump(json.loads(text))
            except json.JSONDecodeError as exc:
                raise SpecInvalid([("(json)", str(exc))]) from None
        specs = load_specs(text)
        applied = []
        async with self.pool.connection() as conn:
            for spec in specs:
                a = await employees.apply(conn, spec, self.endpoints)
                applied.append({"name": a.name, "created": a.created, "changed": a.changed})
        return JSONResponse({"applied": applied})

    async def list(self, request: Request) -> Response:
        """
        summary: List employees with their live generation
        responses:
          200: {description: the employees}
        """
        async with self.pool.connection() as conn:
            rows = await employees.list_all(conn)
        return JSONResponse({"employees": [_row(r) for r in rows]})

    async def get(self, request: Request) -> Response:
        """
        summary: One employee with its live generation
        responses:
          200: {description: the employee}
          404: {description: no such employee}
        """
        async with self.pool.connection() as conn:
            row = await employees.get(conn, request.path_params["name"])
        return JSONResponse({**_row(row), "spec": row["spec"]})

    async def lifecycle(self, request: Request) -> Response:
        """
        summary: "POST /v1/employees/{name}:start|:stop|:resume|:reset|:interrupt"
        description: >
          Commits the change and an intent, and answers at once (no Temporal call on this
          path); the intent shows `applying` until the relay's deliverer applied it.
          `:interrupt` takes `{"conversation": "<lane>/<thread>"}` (default `talk/main`).
        responses:
          202: {description: "{name, generation, state, intent}"}
          400: {description: a malformed body}
          404: {description: no such employee, action or conversation}
          409: {description: the employee's state does not allow it}
        """
        name, _, action = str(request.path_params["action_path"]).partition(":")
        if action not in LIFECYCLE or "/" in name:
            raise NotFound(f"no action {action!r}; use :{', :'.join(sorted(LIFECYCLE))}")
        body = await _json_body(request) if action == names.INTENT_INTERRUPT else {}
        async with self.pool.connection() as conn:
            if action == names.INTENT_INTERRUPT:
                conversation = body.get("conversation", f"{names.LANE_TALK}/{names.THREAD_MAIN}")
                req = await intents.interrupt(conn, name, str(conversation))
            else:
                req = await intents.lifecycle(conn, name, action)
        if self.kicker is not None:
            self.kicker.kick()
        return _requested(req)

    async def limits(self, request: Request) -> Response:
        """
        summary: Replace the live generation's limits (absolute values, e.g. `{"daily_usd": 20}`)
        responses:
          202: {description: "{name, generation, state, intent}"}
          400: {description: an unknown limit or a value that is not a positive number}
          404: {description: no such employee}
          409: {description: the employee has no live generation}
        """
        body = await _json_body(request)
        async with self.pool.connection() as conn:
            req = await intents.set_limits(conn, request.path_params["name"], body)
        return _requested(req)

    async def intent(self, request: Request) -> Response:
        """
        summary: One intent, `applying` until applied (then `applied` or `failed`)
        responses:
          200: {description: the intent}
          404: {description: no such intent}
        """
        async with self.pool.connection() as conn:
            row = await intents.get(conn, int(request.path_params["intent_id"]))
        return JSONResponse(intents.intent_view(row))

    async def rearm(self, request: Request) -> Response:
        """
        summary: Re-arm Temporal from the database (supervisors, schedules, lost entities)
        responses:
          202: {description: the re-arm intent}
        """
        async with self.pool.connection() as conn:
            row = await intents.rearm(conn)
        return JSONResponse(intents.intent_view(row), status_code=202)

    async def chat_message(self, request: Request) -> Response:
        """
        summary: One owner message, its status and its reply once there is one
        responses:
          200: {description: "{message_id, status, reply}"}
          404: {description: no such message}
        """
        name, message_id = request.path_params["name"], int(request.path_params["message_id"])
        async with self.pool.connection() as conn:
            row = await chat.message(conn, name, message_id)
        return JSONResponse(
            {"message_id": row["id"], "status": row["status"], "reply": row["reply"]}
        )

    async def chat_events(self, request: Request) -> Response:
        """
        summary: "Server-sent events of one chat session: `run.start`, `run.input_merged` and
          `reply` (query: session, after)"
        responses:
          200: {description: a text/event-stream for this session's audience only}
        """
        name = request.path_params["name"]
        session = request.query_params.get("session", chat.DEFAULT_SESSION)
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            raise EventRejected("after must be an integer") from None
        async with self.pool.connection() as conn:
            await employees.get(conn, name)  # 404 before the stream starts
        return StreamingResponse(self._events(request, name, session, after),
                                 media_type="text/event-stream")  # fmt: skip

    async def _events(
        self, request: Request, name: str, session: str, after: int
    ) -> AsyncIterator[str]:
        """Poll this session's events (only its own audience) and stream them."""
        yield ": connected\n\n"
        idle = 0.0
        while not await request.is_disconnected():
            async with self.pool.connection() as conn:
                rows = await chat.events_after(conn, name, session, after)
            for row in rows:
                after = int(row["id"])
                doc: dict[str, object] = {"id": after, "turn_id": row["turn_id"]}
                if row["kind"] == names.RUN_REPLY:
                    doc["text"] = row["text"]
                else:
                    doc["message_ids"] = list(row["message_ids"])
                yield f"id: {after}\nevent: {row['kind']}\ndata: {json.dumps(doc)}\n\n"
            idle = 0.0 if rows else idle + SSE_POLL_S
            if idle >= SSE_KEEPALIVE_S:
                idle = 0.0
                yield ": keep-alive\n\n"
            await asyncio.sleep(SSE_POLL_S)

    async def chat(self, request: Request) -> Response:
        """
        summary: Send the owner's message (202, queued)
        requestBody:
          content:
            application/json:
              schema:
                type: object
                required: [client_message_id, text]
                properties:
                  client_message_id: {type: string}
                  text: {type: string}
                  session: {type: string}
        responses:
          202: {description: queued; the body has message_id and status}
          429: {description: queue_full, nothing saved}
        """
        doc = await _json_body(request)
        client_id, text = doc.get("client_message_id"), doc.get("text")
        session = doc.get("session", chat.DEFAULT_SESSION)
        if not (isinstance(client_id, str) and isinstance(text, str) and isinstance(session, str)):
            raise EventRejected("client_message_id, text and session must be strings")
        async with self.pool.connection() as conn:
            q = await chat.send(conn, request.path_params["name"], client_id, text, session)
        if self.kicker is not None and not q.duplicate:
            self.kicker.kick()
        body = {"message_id": q.message_id, "status": q.status, "duplicate": q.duplicate}
        return JSONResponse(body, status_code=202)
