"""What a tool is: a JSON Schema for the model, an effect class, and a handler.

Effect classes (SPEC §11): `read_only` calls may run again freely; `idempotent` calls carry a
natural or provider key, so running again changes nothing; `unsafe` calls (the default) may
have reached the outside world when they broke off, so they run at most once and end
`unknown` otherwise. A *transactional* tool's effect lives in our database: its handler runs
in the transaction that records the call, so the effect and the record commit together and a
retry finds the result (it is idempotent by construction). Any other tool reaches outside.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from eventos.contracts import ToolCallInput
from eventos.db import Conn
from eventos.settings import SecretStore
from eventos.spec.model import Agent, EmployeeSpec


class Effect(StrEnum):
    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    UNSAFE = "unsafe"


class ToolRefused(Exception):
    """The call cannot be done as asked; the model reads why and may try otherwise (bad
    arguments, a limit reached, a target that does not exist)."""


class ToolMisconfigured(Exception):
    """The employee or the instance is set up so the tool cannot work (a missing secret, a
    tool the spec does not allow): not retried, the model is told, the owner should fix it."""


@dataclass
class ToolContext:
    """What a handler may use. `conn` is inside the transaction that records the call for a
    transactional tool; a tool that reaches outside holds no connection while it calls."""

    call: ToolCallInput
    conn: Conn
    spec: EmployeeSpec
    agent: Agent
    secrets: SecretStore
    now: datetime
    extras: dict[str, Any] = field(default_factory=dict)  # per-family settings, by name


Handler = Callable[[ToolContext, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Tool:
    """One tool: its name (normative, SPEC §17), what the model is told, its arguments' JSON
    Schema, its effect class (or how the arguments decide it), and its handler."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Handler
    effect: Effect | Callable[[dict[str, Any]], Effect] = Effect.UNSAFE
    transactional: bool = False

    def effect_of(self, args: dict[str, Any]) -> Effect:
        return self.effect(args) if callable(self.effect) else self.effect


def obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A closed JSON Schema object (no extra arguments)."""
    return {"type": "object", "properties": properties, "required": required or [],
            "additionalProperties": False}  # fmt: skip


def result_text(result: dict[str, Any]) -> str:
    """A result as the model reads it: compact JSON."""
    return json.dumps(result, separators=(",", ":"), sort_keys=True, default=str)
