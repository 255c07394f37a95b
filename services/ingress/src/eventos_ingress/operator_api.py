"""The owner API's operator surfaces (SPEC §12, §17): attention items, dead letters, replay.

`GET /v1/attention` lists items (a user: their own audience's), `GET /v1/attention/{id}` shows
one, `POST /v1/attention/{id}:ack|:resolve|:act` handles one (`eventos.operator.attention`).
`GET /v1/dead-letters` lists what died and `POST /v1/replay` replays it in two calls: the
selector alone answers what it would replay with a confirmation, the selector with that
confirmation replays (`eventos.operator.replay`). Dead letters and replay are the admin's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from eventos.db import Conn
from eventos.errors import InputInvalid, NotFound
from eventos.operator import attention, dead_letters, replay
from eventos.operator.pages import page_limit, parse_time
from eventos.runtime.wake import Kicker
from eventos_ingress import bodies

VERBS = ("ack", "resolve", "act")
ACT_KEYS = ("action", "daily_usd")
REPLAY_KEYS = ("selector", "confirmation")
BOOLEANS = {"true": True, "false": False}


def _item_id(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()):
        raise NotFound("use /v1/attention/<item id>[:ack|:resolve|:act]")
    if len(raw) > 18:
        raise NotFound(f"no attention item {raw}")
    return int(raw)


def _only(doc: dict[str, Any], keys: tuple[str, ...]) -> None:
    unknown = sorted(set(doc) - set(keys))
    if unknown:
        raise InputInvalid(unknown[0], f"unknown field; use {', '.join(keys)}")


def _boolean(request: Request, key: str) -> bool | None:
    raw = request.query_params.get(key)
    if raw is not None and raw not in BOOLEANS:
        raise InputInvalid(key, "must be true or false")
    return None if raw is None else BOOLEANS[raw]


@dataclass
class OperatorApi:
    pool: AsyncConnectionPool[Conn]
    kicker: Kicker | None = None

    async def attention_list(self, request: Request, caller: attention.Caller) -> Response:
        """Attention items newest first: `?state=open,acked&employee=&kind=&cursor=&limit=`."""
        q = request.query_params
        async with self.pool.connection() as conn:
            items, following = await attention.page(
                conn, caller, state=q.get("state"), employee=q.get("employee"),
                kind=q.get("kind"), limit=page_limit(q.get("limit")), cursor=q.get("cursor"),
            )  # fmt: skip
        return JSONResponse({"attention": items, "next_cursor": following})

    async def attention_get(self, request: Request, caller: attention.Caller) -> Response:
        """One attention item with the actions the caller may take."""
        item_id = _item_id(str(request.path_params["item_id"]))
        async with self.pool.connection() as conn:
            return JSONResponse(await attention.get(conn, item_id, caller))

    async def attention_post(self, request: Request, caller: attention.Caller) -> Response:
        """`{id}:ack`, `{id}:resolve`, or `{id}:act` with `{"action": …}`."""
        raw, _, verb = str(request.path_params["target"]).partition(":")
        if verb not in VERBS:
            raise NotFound("use POST /v1/attention/<item id>:ack, :resolve or :act")
        item_id = _item_id(raw)
        body = await bodies.read_object(request)
        async with self.pool.connection() as conn:
            if verb == "ack":
                return JSONResponse(await attention.ack(conn, item_id, caller))
            if verb == "resolve":
                return JSONResponse(await attention.resolve(conn, item_id, caller))
            _only(body, ACT_KEYS)
            action = body.get("action")
            if not isinstance(action, str):
                raise InputInvalid("action", "is required and must be a string")
            done = await attention.act(conn, item_id, action, body, caller)
        if self.kicker is not None:
            self.kicker.kick()
        return JSONResponse(done, status_code=202)

    async def dead_letters(self, request: Request, caller: object) -> Response:
        """Dead letters newest first: `?reason=&source=&employee=&since=&until=&replayed=`."""
        q = request.query_params
        letters = dead_letters.Letters(
            reason=q.get("reason"), source=q.get("source"), employee=q.get("employee"),
            since=parse_time("since", q.get("since")), until=parse_time("until", q.get("until")),
            replayed=_boolean(request, "replayed"),
        )  # fmt: skip
        async with self.pool.connection() as conn:
            rows, following = await dead_letters.page(
                conn, letters, limit=page_limit(q.get("limit")), cursor=q.get("cursor")
            )
        return JSONResponse({"dead_letters": rows, "next_cursor": following})

    async def replay(self, request: Request, caller: object) -> Response:
        """A selector alone: what it would replay and its confirmation (200); with the
        confirmation: the replay (202)."""
        body = await bodies.read_object(request)
        _only(body, REPLAY_KEYS)
        letters = replay.selector(body.get("selector"))
        async with self.pool.connection() as conn:
            if "confirmation" not in body:
                seen = await replay.preview(conn, letters)
                return JSONResponse({
                    "count": seen.count, "sample": seen.sample,
                    "already_replayed": seen.already_replayed, "confirmation": seen.confirmation,
                    "expires_at": None if seen.expires_at is None else seen.expires_at.isoformat(),
                })  # fmt: skip
            done = await replay.confirm(conn, letters, body["confirmation"])
        if self.kicker is not None and done.replays:
            self.kicker.kick()
        return JSONResponse({
            "replayed": len(done.replays), "already_replayed": len(done.already),
            "replays": [{"id": letter, "as": new} for letter, new in done.replays],
            "already": done.already,
        }, status_code=202)  # fmt: skip
