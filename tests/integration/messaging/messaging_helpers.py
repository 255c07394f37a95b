"""Employees that message each other, and tool calls made as their turns would make them."""

from __future__ import annotations

import json
import uuid
from typing import Any

from conftest import apply_and_start
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.contracts import ToolCallInput
from eventos.db import Conn
from eventos.settings import SecretStore
from eventos.tools.runner import ToolRunner

TOOLS = "[send_to_employee, delegate_to_employee, complete_task]"
CHAT_ROUTE = {"kind": "chat", "trigger": "chat", "agent": "front", "thread": "main",
              "reply": True, "session": "owner", "audience": "owner"}  # fmt: skip


def spec(name: str) -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents:
    - name: front
      model: {{provider: local, name: scripted}}
      system: You work with other employees.
      tools: {TOOLS}
  triggers:
    - {{kind: chat}}
"""


async def team(pool: AsyncConnectionPool[Conn], *prefixes: str, activate: bool = True) -> list[str]:
    """Running employees named `<prefix><hex>` (the `peer_` thread shape allows [a-z0-9-])."""
    tag = uuid.uuid4().hex[:6]
    names = [f"{p}{tag}" for p in prefixes]
    await apply_and_start(pool, "\n---\n".join(spec(n) for n in names), activate=activate)
    return names


def call(employee: str, tool: str, args: dict[str, Any], *, thread: str = "main",
         lane: str = "talk", route: dict[str, Any] | None = None, hop: int = 0,
         path: list[str] | None = None, woken_tasks: list[str] | None = None,
         chain: str = "chain-1") -> ToolCallInput:  # fmt: skip
    """One call of a turn of `employee` in `thread`, with the turn's causal context."""
    turn = f"turn-{employee}-{thread}-{uuid.uuid4().hex[:8]}"
    return ToolCallInput(
        employee, 1, "front", thread, lane, f"{employee}/g1/{lane}/{thread}", turn,
        f"call_{uuid.uuid4().hex[:12]}", tool, json.dumps(args), 1,
        dict(route or CHAT_ROUTE), chain, hop, list(path or []),
        woken_tasks=list(woken_tasks or []),
    )  # fmt: skip


def landed(sender: str, lane: str = "talk", thread: str = "main") -> dict[str, str]:
    """Where a message or task from `sender`'s conversation (lane, thread) lands in its target:
    the `call` arguments of a turn there."""
    return {"thread": names.peer_thread(sender, lane, thread), "lane": names.LANE_WORKER}


def runner(pool: AsyncConnectionPool[Conn]) -> ToolRunner:
    return ToolRunner(pool, SecretStore(env={}))


async def run(pool: AsyncConnectionPool[Conn], c: ToolCallInput) -> tuple[str, dict[str, Any]]:
    """(outcome, result) of one call."""
    result = await runner(pool).run(c)
    return result.outcome, json.loads(result.content)
