"""The owner API under `/v1/` (SPEC §6.2, §17), behind bearer tokens.

The admin token may do everything and chats as the audience `owner`; a user token may chat,
read its own messages and follow its own event streams (streams_api.py), and see and handle its
own approvals and attention items; nothing else (403). Chat calls are always scoped to the
caller's audience (`eventos.owner.users`).

Every operation runs inside one guard: authenticate, check the caller may do it, check the
path and query values and the declared body length, translate database errors (an outage is a
503, never a 500) and answer every refusal as `application/problem+json` (`problems.py`).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route

from eventos import names
from eventos.console.settings import ConsoleSettings
from eventos.db import Conn, translate
from eventos.employees import deletion, drain, intents, lifecycle
from eventos.errors import (
    EventOSError,
    Forbidden,
    InputInvalid,
    NotFound,
    Unauthenticated,
)
from eventos.health import degraded
from eventos.llm.endpoints import LlmEndpoints
from eventos.owner import chat, users
from eventos.owner.wakeups import StreamWakeups
from eventos.runtime.wake import Kicker
from eventos.scheduling.policy import SchedConfig
from eventos.secret_purposes import SecretPurposes
from eventos.settings import AdminSettings
from eventos.spec.model import parse_specs, yaml_documents
from eventos.timeline import messages
from eventos_ingress import bodies, openapi, problems
from eventos_ingress.approvals_api import ApprovalsApi
from eventos_ingress.console_api import ConsoleApi
from eventos_ingress.operator_api import OperatorApi
from eventos_ingress.outbox_api import OutboxApi
from eventos_ingress.streams_api import StreamsApi
from eventos_ingress.timeline_api import TimelineApi

log = logging.getLogger(__name__)

SSE_POLL_S = 0.25  # while no listener hears chat events
SSE_RECHECK_S = 5.0  # while one does (its wake-ups are hints)
SSE_KEEPALIVE_S = 15.0
LIFECYCLE = {*intents.LIFECYCLE, names.INTENT_INTERRUPT}
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@dataclass(frozen=True)
class Caller:
    """Who is calling: the audience whose content the call may see, whether it is the
    instance's admin, and for a user its record (what it reads starts at its creation)."""

    audience: str
    admin: bool
    user: users.User | None = None

    @property
    def since(self) -> datetime | None:
        return None if self.user is None else self.user.created_at


Handler = Callable[[Request, Caller], Awaitable[Response]]


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


def _requested(req: intents.Requested) -> Response:
    """202: the change is committed; its intent is `applying` until the deliverer applies it."""
    body = {"name": req.employee, "generation": req.generation, "state": req.state,
            "intent": intents.intent_view(req.intent)}  # fmt: skip
    return JSONResponse(body, status_code=202)


def _encoded_slash(request: Request) -> bool:
    """A `%2F` in the path: no name holds a `/`, and decoded it would reach another route."""
    raw = request.scope.get("raw_path") or b""
    return b"%2f" in raw.lower()


def _check_values(request: Request) -> None:
    """Path and query values are text for the database: no NUL, no lone surrogate."""
    for key, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        bodies.check_text(key, "(query)")
        bodies.check_text(str(value), key)


def _id(request: Request, key: str) -> int:
    """A numeric id from the path; ids are bigint, so a longer number names nothing."""
    raw = str(request.path_params[key])
    if not (raw.isascii() and raw.isdigit()):
        raise InputInvalid(key, "must be a non-negative integer")
    if len(raw) > 18:
        raise NotFound(f"no {key.removesuffix('_id')} {raw}")
    return int(raw)


def _user_terms(klass: int, daily_usd: Any) -> dict[str, Any]:
    """A user's class (`c1`/`c2`) and daily cap (None: the default share), as shown."""
    return {"class": f"c{klass}", "daily_usd": None if daily_usd is None else float(daily_usd)}


def _string(doc: dict[str, Any], key: str, default: str | None = None) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str):
        raise InputInvalid(key, "is required and must be a string")
    return value


@dataclass
class OwnerApi:
    """Handlers of the owner API."""

    pool: AsyncConnectionPool[Conn]
    admin: AdminSettings  # the admin token, re-read from its file when that changes
    wakeups: StreamWakeups  # wakes the event streams when their events are placed
    kicker: Kicker | None = None
    endpoints: LlmEndpoints = field(default_factory=LlmEndpoints)  # what apply allows models
    sched: SchedConfig = field(default_factory=SchedConfig)  # admission's, to explain waits
    purposes: SecretPurposes = field(default_factory=SecretPurposes)  # what apply allows refs
    console_settings: ConsoleSettings = field(default_factory=ConsoleSettings)

    def __post_init__(self) -> None:
        self.outbox = OutboxApi(self.pool)
        self.approvals = ApprovalsApi(self.pool, self.kicker)
        self.console = ConsoleApi(self.pool, self.console_settings)
        self.operator = OperatorApi(self.pool, self.kicker)

        self.timeline = TimelineApi(self.pool, self.sched)
        self.streams = StreamsApi(self.pool, self.wakeups)

    async def authenticate(self, request: Request) -> Caller:
        """The caller of a bearer token: the admin's (compared in constant time), else a user's
        (looked up by its hash)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:  # the scheme is case-insensitive (RFC 9110)
            raise Unauthenticated()
        given = token.encode("utf-8", "surrogateescape")
        # Each accepted token (two within a rotation's overlap window) is compared, in
        # constant time each.
        if any([hmac.compare_digest(given, admin) for admin in self.admin.tokens()]):
            return Caller(users.OWNER, admin=True)
        if token.startswith(users.TOKEN_PREFIX):
            async with self.pool.connection() as conn:
                user = await users.by_token(conn, token)
            if user is not None:
                return Caller(user.name, admin=False, user=user)
        raise Unauthenticated()

    def operation(
        self, path: str, handler: Handler, method: str, *, cap: int = bodies.JSON_BODY_MAX,
        users: bool = False,
    ) -> Route:  # fmt: skip
        """One `/v1/` operation behind the guard; `users`: a user token may call it too."""

        async def run(request: Request) -> Response:
            try:
                async with translate():
                    caller = await self.authenticate(request)
                    if not (users or caller.admin):
                        raise Forbidden("only the admin token may do this")
                    if _encoded_slash(request):
                        raise NotFound("no name holds a '/'")
                    _check_values(request)
                    bodies.check_declared(request, cap)
                    return await handler(request, caller)
            except EventOSError as exc:
                return problems.from_error(exc)
            except ClientDisconnect:
                # The client went, or its body was cut for being too slow (408 answered by
                # the server): nothing to answer and nothing unexpected.
                return Response(status_code=400)
            except Exception:
                log.exception("unexpected error on %s %s", method, path)
                return problems.problem(problems.INTERNAL, "unexpected error; see the ingress log")

        run.__doc__ = handler.__doc__
        return Route(path, run, methods=[method])

    def routes(self) -> list[BaseRoute]:
        op = self.operation
        v1: list[BaseRoute] = [
            op("/v1/employees", self.apply, "POST", cap=bodies.APPLY_BODY_MAX),
            op("/v1/employees", self.list, "GET"),
            op("/v1/employees/{name}", self.get, "GET"),
            op("/v1/employees/{name}", self.delete, "DELETE"),
            op("/v1/employees/{name}/chat", self.chat, "POST", users=True),
            op("/v1/employees/{name}/chat/events", self.streams.chat, "GET", users=True),
            op("/v1/employees/{name}/chat/{message_id}", self.chat_message, "GET", users=True),
            op("/v1/employees/{name}/limits", self.limits, "POST"),
            op("/v1/employees/{name}/timeline", self.timeline.list, "GET"),
            op("/v1/employees/{name}/waiting", self.timeline.waiting, "GET"),
            op("/v1/employees/{target}", self.lifecycle, "POST"),
            op("/v1/intents/{intent_id}", self.intent, "GET"),
            op("/v1/rearm", self.rearm, "POST"),
            op("/v1/events", self.streams.operator, "GET", users=True),
            op("/v1/attention", self.operator.attention_list, "GET", users=True),
            op("/v1/attention/{target}", self.operator.attention_post, "POST", users=True),
            op("/v1/attention/{item_id}", self.operator.attention_get, "GET", users=True),
            op("/v1/dead-letters", self.operator.dead_letters, "GET"),
            op("/v1/replay", self.operator.replay, "POST"),
            op("/v1/approvals", self.approvals.list, "GET", users=True),
            op("/v1/approvals/{target}", self.approvals.decide, "POST", users=True),
            op("/v1/approvals/{approval_id}", self.approvals.get, "GET", users=True),
            op("/v1/outbox", self.outbox.list, "GET"),
            op("/v1/outbox/{target}", self.outbox.retry, "POST"),
            op("/v1/users", self.user_add, "POST"),
            op("/v1/users", self.user_list, "GET"),
            op("/v1/users/{name}", self.user_remove, "DELETE"),
            # The web console's reads (console_api.py).
            op("/v1/me", self.console.me, "GET", users=True),
            op("/v1/counts", self.console.counts, "GET", users=True),
            op("/v1/employee-summaries", self.console.summaries, "GET"),
            op("/v1/employees/{name}/conversations", self.console.conversations, "GET"),
            op("/v1/employees/{name}/turns", self.console.turns, "GET"),
            op("/v1/employees/{name}/turns/{turn_id}", self.console.turn, "GET"),
            op("/v1/employees/{name}/turns/{turn_id}/transcript", self.console.transcript, "GET"),
            op("/v1/employees/{name}/chat", self.console.chat_history, "GET", users=True),
        ]

        async def unmatched(request: Request) -> Response:
            """404 for a path nothing serves under /v1/, 405 for a method a path does not."""
            allowed = set()
            for route in [] if _encoded_slash(request) else v1:
                match, _ = route.matches(request.scope)
                if match == Match.PARTIAL and isinstance(route, Route):
                    allowed |= route.methods or set()
            if allowed:
                return problems.method_not_allowed(sorted(allowed))
            return problems.not_found(f"nothing is served at {request.url.path}")

        return [
            *v1,
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/v1/{rest:path}", unmatched, methods=ALL_METHODS),
            Route("/v1", unmatched, methods=ALL_METHODS),
        ]

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI 3.1 document of the owner API."""
        return JSONResponse(openapi.document())

    async def apply(self, request: Request, caller: Caller) -> Response:
        """Apply employee specs (YAML, several documents allowed, or JSON)."""
        raw = await bodies.read_capped(request, bodies.APPLY_BODY_MAX)
        if "json" in request.headers.get("content-type", ""):
            docs = [bodies.parse_json(raw)]
        else:
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                raise InputInvalid(bodies.BODY, "the spec must be UTF-8") from None
            docs = yaml_documents(text)
            for doc in docs:
                bodies.check_document(doc)
        specs = parse_specs(docs)
        applied = []
        async with self.pool.connection() as conn:
            for spec in specs:
                # A flag change drains the live generation into a new one (docs/flags.md).
                a, draining = await drain.apply(conn, spec, self.endpoints, self.purposes)
                item = {"name": a.name, "created": a.created, "changed": a.changed}
                applied.append(item | ({"draining": draining} if draining is not None else {}))
        return JSONResponse({"applied": applied})

    async def list(self, request: Request, caller: Caller) -> Response:
        """Every employee with its live generation."""
        async with self.pool.connection() as conn:
            rows = await lifecycle.list_all(conn)
        return JSONResponse({"employees": [_row(r) for r in rows]})

    async def get(self, request: Request, caller: Caller) -> Response:
        """One employee, its live generation, its stored spec and whether it is degraded."""
        async with self.pool.connection() as conn:
            row = await lifecycle.get(conn, request.path_params["name"])
            sick = await degraded.view(conn, row["name"])
        return JSONResponse({**_row(row), "spec": row["spec"], "degraded": sick})

    async def delete(self, request: Request, caller: Caller) -> Response:
        """Delete an employee with no live generation (409 while starting or running: stop it
        first); a paused generation retires with a Reset intent. Its history stays."""
        async with self.pool.connection() as conn:
            done = await deletion.delete(conn, request.path_params["name"])
        if done.intent is not None and self.kicker is not None:
            self.kicker.kick()
        return JSONResponse({
            "name": done.name, "deleted_at": done.deleted_at.isoformat(),
            "retired_generation": done.retired_generation,
            "intent": intents.intent_view(done.intent),
        })  # fmt: skip

    async def lifecycle(self, request: Request, caller: Caller) -> Response:
        """`:start`, `:stop`, `:resume`, `:reset`, `:interrupt`: the change and an intent."""
        name, _, action = str(request.path_params["target"]).partition(":")
        if action not in LIFECYCLE:
            raise NotFound(f"no action {action!r}; use :{', :'.join(sorted(LIFECYCLE))}")
        if action == names.INTENT_INTERRUPT:
            body = await bodies.read_object(request)
            main = f"{names.LANE_TALK}/{names.THREAD_MAIN}"
            conversation = _string(body, "conversation", main)
            async with self.pool.connection() as conn:
                req = await intents.interrupt(conn, name, conversation)
        else:
            async with self.pool.connection() as conn:
                req = await intents.request(conn, name, action)
        if self.kicker is not None:
            self.kicker.kick()
        return _requested(req)

    async def limits(self, request: Request, caller: Caller) -> Response:
        """Replace the live generation's limits (absolute values)."""
        body = await bodies.read_object(request)
        async with self.pool.connection() as conn:
            req = await intents.set_limits(conn, request.path_params["name"], body)
        return _requested(req)

    async def intent(self, request: Request, caller: Caller) -> Response:
        """One intent, `applying` until applied (then `applied` or `failed`)."""
        async with self.pool.connection() as conn:
            row = await intents.get(conn, _id(request, "intent_id"))
        return JSONResponse(intents.intent_view(row))

    async def rearm(self, request: Request, caller: Caller) -> Response:
        """Re-arm Temporal from the database (supervisors, schedules, lost entities)."""
        async with self.pool.connection() as conn:
            row = await intents.rearm(conn)
        return JSONResponse(intents.intent_view(row), status_code=202)

    async def chat_message(self, request: Request, caller: Caller) -> Response:
        """One owner message, its status and its reply once there is one."""
        name, message_id = request.path_params["name"], _id(request, "message_id")
        async with self.pool.connection() as conn:
            row = await chat.message(conn, name, message_id, caller.audience,
                                     caller.since or chat.EPOCH)  # fmt: skip
            # A held reply shows as held for review, never its draft (SPEC §17); the admin
            # reads the gate holding the message too (the one `waiting` gives it).
            body = await messages.message_view(conn, name, row, self.sched, caller.admin)
        return JSONResponse(body)

    async def chat(self, request: Request, caller: Caller) -> Response:
        """Send a message as the caller's audience (202, queued)."""
        doc = await bodies.read_object(request)
        client_id, text = _string(doc, "client_message_id"), _string(doc, "text")
        session = _string(doc, "session", names.DEFAULT_SESSION)
        async with self.pool.connection() as conn:
            q = await chat.send(
                conn, request.path_params["name"], client_id, text, session, caller.user
            )
        if self.kicker is not None and not q.duplicate:
            self.kicker.kick()
        body = {"message_id": q.message_id, "status": q.status, "duplicate": q.duplicate}
        return JSONResponse(body, status_code=202)

    async def user_add(self, request: Request, caller: Caller) -> Response:
        """Create a user (`{name, class?: c1|c2, daily_usd?}`: its chat's class, C2 unless
        granted C1, and its daily spend cap per employee, else a share of the employee's
        budget); its token is shown in this answer only."""
        body = await bodies.read_object(request)
        name = _string(body, "name")
        klass = users.class_of(body.get("class"))
        daily_usd = users.daily_usd_of(body.get("daily_usd"))
        async with self.pool.connection() as conn:
            created = await users.create(conn, name, klass, daily_usd)
        return JSONResponse({"name": created.name, "id": created.id, "token": created.token,
                             **_user_terms(created.klass, created.daily_usd)},
                            status_code=201)  # fmt: skip

    async def user_list(self, request: Request, caller: Caller) -> Response:
        """Every user (never a token)."""
        async with self.pool.connection() as conn:
            rows = await users.list_all(conn)
        listed = [{"name": r["name"], "id": str(r["id"]),
                   **_user_terms(int(r["class"]), r["daily_usd"]),
                   "created_at": r["created_at"].isoformat()} for r in rows]  # fmt: skip
        return JSONResponse({"users": listed})

    async def user_remove(self, request: Request, caller: Caller) -> Response:
        """Remove a user: its token stops working at once."""
        async with self.pool.connection() as conn:
            await users.remove(conn, request.path_params["name"])
        return Response(status_code=204)
