"""The local provider (`provider: local`, SPEC §17): deterministic, offline, labelled, scripted.

Scripts are lines in the last user message: `call: <tool> <json-args>` (several lines make one
batch), `sleep: <seconds>`, `fail: <status> [<first N attempts>] [retry-after=<s>]`, and
`say: <JSON string>`: the reply is that string, decoded (so a test can make the model answer
anything, a NUL `"\u0000"` included, which no owner message may carry).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass, field

from eventos.contracts import ChatMessage, LlmStepInput, LlmStepOutput, ToolCall
from eventos.llm.openai import status_error

LOCAL_LABEL = "[local]"
QUOTE_MAX = 200
_CALL = re.compile(r"^\s*call:\s*(?P<name>[A-Za-z0-9_.\-]+)\s*(?P<args>.*?)\s*$")
_SAY = re.compile(r'^\s*say:\s*(?P<text>".*")\s*$')
_SLEEP = re.compile(r"^\s*sleep:\s*(?P<seconds>\d+(?:\.\d+)?)\s*$")
_FAIL = re.compile(
    r"^\s*fail:\s*(?P<status>\d{3})(?:\s+(?P<times>\d+))?(?:\s+retry-after=(?P<after>\S+))?\s*$"
)


@dataclass(frozen=True)
class LocalScript:
    """What the lines of the last user message ask the local provider to do."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    sleep_s: float = 0.0
    fail_status: int | None = None
    fail_times: int | None = None  # fail the first N attempts; None: every attempt
    fail_retry_after: str | None = None
    text: str = ""
    say: str | None = None  # the reply, verbatim


def parse_script(content: str) -> LocalScript:
    """The directives (`call:`, `sleep:`, `fail:`) and the remaining text of a message."""
    calls: list[tuple[str, str]] = []
    sleep_s, fail, rest, say = 0.0, None, [], None
    for line in content.splitlines():
        if m := _CALL.match(line):
            calls.append((m["name"], m["args"] or "{}"))
        elif (m := _SAY.match(line)) and isinstance(said := _json_string(m["text"]), str):
            say = said
        elif m := _SLEEP.match(line):
            sleep_s += float(m["seconds"])
        elif m := _FAIL.match(line):
            fail = m
        elif line.strip():
            rest.append(line.strip())
    return LocalScript(
        calls=calls,
        sleep_s=sleep_s,
        fail_status=int(fail["status"]) if fail else None,
        fail_times=int(fail["times"]) if fail and fail["times"] else None,
        fail_retry_after=fail["after"] if fail else None,
        text=" ".join(rest),
        say=say,
    )


def _json_string(text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


@dataclass
class LocalProvider:
    """`provider: local`: deterministic, offline, labelled, scriptable (SPEC §17)."""

    name: str = "local"

    async def complete(self, step: LlmStepInput, attempt: int = 1) -> LlmStepOutput:
        """Answer tool results with a summary, else follow the last user message's script."""
        if step.messages and step.messages[-1].role == "tool":
            return self._answer(step, _summarize_tool_results(step.messages))
        script = parse_script(_last_user_text(step.messages))
        if script.sleep_s:
            # Cancellable at any point; the activity heartbeats meanwhile, so a cancel arrives.
            await asyncio.sleep(script.sleep_s)
        if script.fail_status is not None and (
            script.fail_times is None or attempt <= script.fail_times
        ):
            headers = {"retry-after": script.fail_retry_after} if script.fail_retry_after else {}
            raise status_error(script.fail_status, headers, model=step.model.name)
        if script.calls:
            return self._call_tools(step, script.calls)
        if script.say is not None:
            return self._answer(step, f"{LOCAL_LABEL} {script.say}")
        quote = _clip(script.text) if script.text else "(nothing)"
        return self._answer(step, f"{LOCAL_LABEL} you said: {quote}")

    def _answer(self, step: LlmStepInput, text: str) -> LlmStepOutput:
        words = text.split()
        finish = "stop"
        if len(words) > step.max_tokens:
            text, finish = " ".join(words[: step.max_tokens]), "length"
        return LlmStepOutput(
            message=ChatMessage("assistant", text),
            finish_reason=finish,
            input_tokens=_input_words(step.messages),
            output_tokens=min(len(words), step.max_tokens),
        )

    def _call_tools(self, step: LlmStepInput, calls: list[tuple[str, str]]) -> LlmStepOutput:
        tool_calls = [
            ToolCall(id=local_call_id(step.turn_id, step.step, i), name=name, arguments=args)
            for i, (name, args) in enumerate(calls)
        ]
        return LlmStepOutput(
            message=ChatMessage("assistant", "", tool_calls=tool_calls),
            finish_reason="tool_calls",
            input_tokens=_input_words(step.messages),
            output_tokens=sum(len(f"{c.name} {c.arguments}".split()) for c in tool_calls),
        )


def local_call_id(turn_id: str, step: int, index: int) -> str:
    """A tool-call id that only depends on where the call was made."""
    digest = hashlib.sha256(f"{turn_id}:{step}:{index}".encode()).hexdigest()
    return f"call_{digest[:24]}"


def _last_user_text(messages: list[ChatMessage]) -> str:
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


def _summarize_tool_results(messages: list[ChatMessage]) -> str:
    results: list[ChatMessage] = []
    for message in reversed(messages):
        if message.role != "tool":
            break
        results.insert(0, message)
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    parts = [
        f"{m.name or names.get(m.tool_call_id or '', 'tool')} returned {_clip(m.content)}"
        for m in results
    ]
    return f"{LOCAL_LABEL} tool results: " + "; ".join(parts)


def _input_words(messages: list[ChatMessage]) -> int:
    return sum(
        len(m.content.split()) + sum(len(f"{c.name} {c.arguments}".split()) for c in m.tool_calls)
        for m in messages
    )


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= QUOTE_MAX else flat[: QUOTE_MAX - 1] + "…"
