"""The one table of tools: every tool an agent may name in `agents[].tools`, with its effect
class (which calls are safe to repeat: `read_only` and `idempotent` ones; every other call is
`unsafe` and runs at most once, SPEC §11). `read_only` says which calls of a model response may
run concurrently (the flag `concurrent_read_only_tools`)."""

from __future__ import annotations

import json

from eventos import names
from eventos.contracts import ToolSpec
from eventos.tools import alarms, data, http, messaging
from eventos.tools.base import Effect, Tool

TOOLS: dict[str, Tool] = {t.name: t for t in (*alarms.TOOLS, *messaging.TOOLS, *http.TOOLS,
                                              *data.TOOLS)}  # fmt: skip
if set(TOOLS) != names.TOOL_NAMES:  # the spec validates agents' tools against names.TOOL_NAMES
    raise RuntimeError(
        f"the tool table and names.TOOL_NAMES differ: {sorted(set(TOOLS) ^ names.TOOL_NAMES)}"
    )


def offered(tool_names: list[str]) -> list[ToolSpec]:
    """What the model is offered for an agent's tools (the OpenAI `tools` format)."""
    return [
        ToolSpec(n, TOOLS[n].description, TOOLS[n].parameters) for n in tool_names if n in TOOLS
    ]


def read_only(name: str, arguments: str) -> bool:
    """Whether a call is read-only by its tool's effect class and its arguments (false for an
    unknown tool or arguments that are not a JSON object: such a call runs alone)."""
    tool = TOOLS.get(name)
    try:
        args = json.loads(arguments)
    except ValueError:
        return False
    if tool is None or not isinstance(args, dict):
        return False
    return tool.effect_of(args) == Effect.READ_ONLY
