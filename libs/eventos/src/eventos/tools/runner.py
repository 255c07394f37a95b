"""One tool call under the `unknown` rule (SPEC §11), recorded in `tool_calls` by its id.

The arguments are checked against the tool's JSON Schema and the agent's allowed tools; a
refusal goes back to the model as the tool result. A transactional tool runs inside the
transaction that records its result, so a retried attempt finds that result instead of acting
twice. Any other tool is marked `called_at` (committed) just before it may reach the outside
world; an attempt that finds an earlier one marked so runs it again only when it is safe to
repeat (`read_only`, `idempotent`); an `unsafe` call becomes `unknown`: the model is told, an
attention item offers Retry, and nothing calls it again on its own.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, cast

import jsonschema
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.bus.jsonsafe import storable_text, storable_value
from eventos.contracts import ToolCallInput, ToolResult
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import NotFound
from eventos.runtime.metrics import TOOL_CALLS
from eventos.settings import SecretStore
from eventos.spec.model import parse_spec
from eventos.tools.base import (
    Effect,
    Tool,
    ToolContext,
    ToolMisconfigured,
    ToolRefused,
    result_text,
)
from eventos.tools.registry import TOOLS

log = logging.getLogger(__name__)


def clip(text: str, limit: int = names.TOOL_RESULT_MAX_BYTES) -> str:
    """A result within the transcript's per-result bound (UTF-8 bytes)."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: limit - 40].decode(errors="ignore") + " …[result cut to 16 KiB]"


def refused(reason: str) -> ToolResult:
    return ToolResult(clip(result_text({"error": reason})), names.TOOL_REFUSED)


def unknown_text(call: ToolCallInput) -> str:
    return result_text({"status": names.TOOL_UNKNOWN, "error": (
        f"the call to {call.name} broke off after it may have reached the outside world; "
        "whether it happened is unknown. It will not be repeated on its own: the owner can "
        "check and retry it."
    )})  # fmt: skip


def parse_arguments(tool: Tool, text: str) -> dict[str, Any]:
    """The model's JSON arguments, checked against the tool's schema (ToolRefused)."""
    if len(text.encode()) > names.TOOL_ARGUMENTS_MAX_BYTES:
        raise ToolRefused(f"arguments over {names.TOOL_ARGUMENTS_MAX_BYTES} bytes")
    try:
        args = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise ToolRefused(f"arguments are not JSON: {exc.msg} at {exc.pos}") from None
    if not isinstance(args, dict):
        raise ToolRefused("arguments must be a JSON object")
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(tool.parameters).iter_errors(args)
    )
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
        raise ToolRefused(f"invalid arguments at {where}: {error.message}")
    return dict(storable_value(args))  # stored with the call: no NUL (it would be refused)


class ToolRunner:
    """Runs calls against one database; `extras` hold per-family settings by name."""

    def __init__(self, pool: AsyncConnectionPool[Conn], secrets: SecretStore,
                 extras: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.pool = pool
        self.secrets = secrets
        self.extras = extras or {}

    async def run(self, call: ToolCallInput, now: datetime | None = None) -> ToolResult:
        result = await self._run(call, now)
        # Labels carry the tool only if it exists: a model's made-up names are not a label.
        TOOL_CALLS.labels(call.name if call.name in TOOLS else "(unknown)", result.outcome).inc()
        return result

    async def _run(self, call: ToolCallInput, now: datetime | None) -> ToolResult:
        tool = TOOLS.get(call.name)
        async with self.pool.connection() as conn:
            ctx = await self._context(conn, call, now or datetime.now(UTC))
            if tool is None or call.name not in ctx.agent.tools:
                return refused(f"tool {call.name!r} is not available")
            try:
                args = parse_arguments(tool, call.arguments)
            except ToolRefused as exc:
                return refused(str(exc))
            if tool.transactional:
                return await self._in_transaction(ctx, tool, args)
            early = await self._before_outside(conn, call, tool.effect_of(args), args)
        if early is not None:
            return early
        # The call itself holds no database connection (it may take the whole timeout).
        result = await self._handle(replace(ctx, conn=cast(Conn, NO_CONNECTION)), tool, args)
        async with self.pool.connection() as conn, conn.transaction():
            return await self._finish(conn, call, result)

    async def _context(self, conn: Conn, call: ToolCallInput, now: datetime) -> ToolContext:
        params = {"employee": call.employee, "generation": call.generation}
        cur = await conn.execute(Q["tool_generation_spec"], params)
        row = await cur.fetchone()
        await conn.commit()
        if row is None:
            raise NotFound(f"no generation {call.employee} g{call.generation}")
        spec = parse_spec(row["spec"], stored=True)
        agent = next((a for a in spec.spec.agents if a.name == call.agent), None)
        if agent is None:
            raise NotFound(f"no agent {call.agent!r} in {call.employee} g{call.generation}")
        return ToolContext(call, conn, spec, agent, self.secrets, now, self.extras)

    async def _begin(self, conn: Conn, call: ToolCallInput, effect: Effect,
                     args: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        cur = await conn.execute(Q["tool_call_begin"], {
            "id": call.key, "employee": call.employee, "generation": call.generation,
            "lane": call.lane, "thread": call.thread, "route": Jsonb(call.route),
            "turn_id": call.turn_id, "name": call.name, "effect": effect.value,
            "arguments": Jsonb(args), "retry_of": call.retry_of,
        })  # fmt: skip
        return dict(await cur.fetchone() or {})

    async def _finish(self, conn: Conn, call: ToolCallInput, result: ToolResult,
                      status: str = names.TOOL_DONE) -> ToolResult:  # fmt: skip
        result = replace(result, content=storable_text(result.content))  # an outside answer's NUL
        await conn.execute(Q["tool_call_finish"], {"id": call.key, "status": status,
                                                   "outcome": result.outcome,
                                                   "result": result.content})  # fmt: skip
        return result

    async def _handle(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> ToolResult:
        try:
            out = await tool.run(ctx, args)
        except ToolRefused as exc:
            return refused(str(exc))
        except ToolMisconfigured as exc:
            log.warning("tool %s of %s is misconfigured: %s", tool.name, ctx.call.employee, exc)
            return ToolResult(result_text({"error": f"misconfigured: {exc}"}), names.TOOL_FAILED)
        return ToolResult(clip(result_text(out)), names.TOOL_OK)

    async def _in_transaction(self, ctx: ToolContext, tool: Tool,
                              args: dict[str, Any]) -> ToolResult:  # fmt: skip
        """The effect and its record commit together: a retry reads the first result."""
        conn, call = ctx.conn, ctx.call
        async with conn.transaction():
            row = await self._begin(conn, call, tool.effect_of(args), args)
            if row["status"] == names.TOOL_DONE:
                return ToolResult(str(row["result"]), str(row["outcome"]))
            try:
                async with conn.transaction():  # a refusal undoes what the handler wrote
                    result = await self._handle(ctx, tool, args)
                    if result.outcome != names.TOOL_OK:
                        raise _Undo(result)
            except _Undo as undo:
                result = undo.result
            return await self._finish(conn, call, result)

    async def _before_outside(self, conn: Conn, call: ToolCallInput, effect: Effect,
                              args: dict[str, Any]) -> ToolResult | None:  # fmt: skip
        """Mark `called_at` (committed) before a call that reaches outside; the result instead
        when an earlier attempt has one, or `unknown` when an unsafe one may have been made."""
        async with conn.transaction():
            row = await self._begin(conn, call, effect, args)
        if row["status"] in (names.TOOL_DONE, names.TOOL_UNKNOWN):
            return ToolResult(str(row["result"]), str(row["outcome"]))
        if row["called_at"] is not None and row["effect"] == Effect.UNSAFE:
            return await self._unknown(conn, call)
        async with conn.transaction():
            await conn.execute(Q["tool_call_calling"], {"id": call.key})
        return None

    async def _unknown(self, conn: Conn, call: ToolCallInput) -> ToolResult:
        result = ToolResult(unknown_text(call), names.TOOL_UNKNOWN)
        async with conn.transaction():
            await self._finish(conn, call, result, status=names.TOOL_UNKNOWN)
            await conn.execute(Q["attention_raise_action"], {
                "employee": call.employee, "kind": names.ATTENTION_TOOL_UNKNOWN,
                "severity": "warning", "ref": call.key, "thread": call.thread,
                "detail": f"{call.name} broke off mid-call; it may or may not have happened",
                "action": names.ACTION_RETRY,
            })  # fmt: skip
        log.warning("tool call %s (%s) is unknown", call.key, call.name)
        return result


class _NoConnection:
    """What an outside tool's context holds instead of a connection: any use is a bug."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("a tool that reaches outside holds no database connection")


NO_CONNECTION = _NoConnection()


class _Undo(Exception):
    def __init__(self, result: ToolResult) -> None:
        self.result = result
