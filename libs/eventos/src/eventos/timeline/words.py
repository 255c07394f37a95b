"""What a timeline entry says, in words a user understands ("webhook stripe accepted",
"turn 3 done: 2 steps, 1,234 tokens, $0.0012", "reply sent"). Written from the entry's kind and
its small facts only: an entry never holds message text, so no summary can carry any."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventos import names

CHANNEL_WORDS = {"whatsapp_business": "WhatsApp", "telegram": "Telegram", "discord": "Discord",
                 "email": "email", "chat": "chat"}  # fmt: skip
FIRED_SOURCES = {"start": "start trigger fired", "alarm": "alarm input accepted"}


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def source_words(d: dict[str, Any]) -> str:
    """What an input is: `webhook stripe`, `chat message`, `message from ops`…"""
    source, trigger = str(d.get("source") or ""), str(d.get("trigger") or "")
    kind = str(d.get("type") or "")
    if source == "webhook":
        return "webhook " + trigger.removeprefix("webhook-")
    if source == names.KIND_CHAT:
        return "chat message"
    if source in names.CHANNEL_KINDS:
        return f"{CHANNEL_WORDS.get(source, source)} message"
    if source == names.IPC_ROUTE_KIND or kind.startswith("eventos.ipc."):
        what = {names.TYPE_IPC_TASK: "task", names.TYPE_IPC_RESULT: "task result",
                names.TYPE_IPC_TIMED_OUT: "task timeout", names.TYPE_IPC_DIGEST: "digest"}.get(
            kind, "message")  # fmt: skip
        sender = d.get("from")
        return f"{what} from {sender}" if sender else what
    if source == "cron":
        return f"cron {trigger}"
    return f"{source or 'internal'} {trigger}".strip() if trigger != source else source


def _input(kind: str, d: dict[str, Any]) -> str:
    seq = d.get("seq")
    if kind == "input.accepted":
        source = str(d.get("source") or "")
        if source in FIRED_SOURCES:
            return FIRED_SOURCES[source]
        if source == "cron":
            return f"cron {d.get('trigger')} fired"
        return f"{source_words(d)} accepted"
    if kind == "input.routed":
        return f"routed to its conversation as C{d.get('class')} input #{seq}"
    if kind == "input.delivered":
        return f"input #{seq} delivered to its conversation"
    if kind == "input.pending":
        return f"input #{seq} back in the queue"
    if kind == "input.skipped":
        return f"input #{seq} skipped: its trigger's turn was running"
    if kind == "input.expired":
        return f"input #{seq} expired ({d.get('reason') or 'past its bound'})"
    return f"input #{seq} dead ({d.get('reason') or 'no reason'})"


def _turn(kind: str, d: dict[str, Any]) -> str:
    n, what = d.get("n"), kind.removeprefix("turn.")
    if kind == "turn.started":
        inputs = _plural(int(d.get("inputs") or 0), "input")
        waited = d.get("waited_s")
        wait = f", waited {float(waited):.1f} s for a slot" if waited else ""
        return f"turn {n} started (C{d.get('class')}, {inputs}{wait})"
    if kind == "turn.parked":
        return f"turn {n} parked: {d.get('error') or 'a failure that may clear'}"
    steps = _plural(int(d.get("steps") or 0), "step")
    cost = f"{_plural(int(d.get('tokens') or 0), 'token')}, ${float(d.get('usd') or 0):.4f}"
    if kind == "turn.done":
        return f"turn {n} done: {steps}, {cost}"
    error = f" ({d['error']})" if d.get("error") else ""
    return f"turn {n} {what}{error} after {steps}, {cost}"


def _reply(kind: str, d: dict[str, Any]) -> str:
    status = kind.removeprefix("reply.")
    channel = CHANNEL_WORDS.get(str(d.get("channel")), str(d.get("channel") or ""))
    if status == "queued":
        again = " again (the owner's Retry)" if d.get("retry") else ""
        return f"reply queued{again} ({channel})"
    if status == "held":
        return f"reply held ({d.get('held_reason') or 'approval'})"
    if status == "unknown":
        return "reply unknown: it may or may not have arrived (Retry in the outbox)"
    return f"reply {status}"


def _alarm(kind: str, d: dict[str, Any]) -> str:
    what = "task deadline" if d.get("alarm_kind") == names.DEADLINE_KIND else "alarm"
    if kind == "alarm.set":
        return f"{what} set for {d.get('due_at')}"
    return f"{what} {kind.removeprefix('alarm.')}"


def _task(kind: str, d: dict[str, Any]) -> str:
    to = d.get("to")
    return {"task.delegated": f"task delegated to {to}", "task.done": f"task done by {to}",
            "task.timed_out": f"task to {to} timed out"}.get(
        kind, f"task to {to} {kind.removeprefix('task.')}")  # fmt: skip


def _tool(kind: str, d: dict[str, Any]) -> str:
    if kind == "tool.unknown":
        return f"tool {d.get('tool')} unknown: it may or may not have happened"
    if kind == "tool.failed":
        return f"tool {d.get('tool')} failed: {d.get('error') or 'no cause recorded'}"
    return f"tool {d.get('tool')} done ({d.get('outcome') or 'ok'})"


def _attention(kind: str, d: dict[str, Any]) -> str:
    return f"attention: {d.get('attention')} ({d.get('severity')})"


def _transcript(kind: str, d: dict[str, Any]) -> str:
    return f"transcript of turn {d.get('n')} viewed by {d.get('by')}"


WORDS: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "input": _input, "turn": _turn, "reply": _reply, "alarm": _alarm, "task": _task,
    "tool": _tool, "attention": _attention, "transcript": _transcript,
}  # fmt: skip


def summary(kind: str, detail: dict[str, Any]) -> str:
    """The entry in words."""
    words = WORDS.get(kind.split(".", 1)[0])
    return words(kind, detail) if words else kind
