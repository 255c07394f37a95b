"""TurnWorkflow, the agent loop of one turn (SPEC §7, §8).

Load the conversation; per step, merge offered inputs first (B1), then one LLM step on the
class queue with an activity id unique across the chain; tool calls are answered before the
next step (a batch is never split); the final answer is saved with the consumed inputs in one
transaction (the consuming save) and sent through the outbox.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from eventos import names
    from eventos.contracts import (
        ChatMessage,
        ConversationContext,
        DeliveryItem,
        LlmStepInput,
        LlmStepOutput,
        OfferInputs,
        Saved,
        SaveTurn,
        TurnInput,
        TurnResult,
    )
    from eventos.workflows import policies


def user_message(item: DeliveryItem) -> ChatMessage:
    """An input as the model reads it: chat text, else the event's JSON (or its reference)."""
    data = (item.payload or {}).get("data")
    if isinstance(data, dict) and isinstance(data.get("text"), str):
        return ChatMessage("user", data["text"])
    if item.body_ref:
        return ChatMessage("user", f"[{item.type} event; body stored as {item.body_ref}]")
    return ChatMessage("user", f"[{item.type} event] {json.dumps(data, sort_keys=True)[:8000]}")


def bounded(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Drop the oldest messages (never the system prompt) until ≤ 393,216 bytes (I7)."""
    size = [len(json.dumps(asdict(m))) for m in messages]
    keep_from = 1
    while (
        sum(size[:1]) + sum(size[keep_from:]) > names.TRANSCRIPT_MAX_BYTES
        and keep_from < len(messages) - 1
    ):
        keep_from += 1
    return messages[:1] + messages[keep_from:]


def tool_unavailable(call_id: str, name: str) -> ChatMessage:
    return ChatMessage("tool", f"error: tool {name!r} is not available", tool_call_id=call_id)


@workflow.defn(name=names.WF_TURN)
class TurnWorkflow:
    """One turn over a prefix of a conversation's inputs."""

    @workflow.init
    def __init__(self, turn: TurnInput) -> None:
        self.offered: list[DeliveryItem] = []
        self.merged = 0

    @workflow.signal(name=names.SIGNAL_OFFER)
    def offer_inputs(self, offer: OfferInputs) -> None:
        self.offered.extend(offer.items)

    @workflow.query(name=names.QUERY_STATUS)
    def status(self) -> dict[str, int]:
        return {"offered": len(self.offered), "merged": self.merged}

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnResult:
        ctx = await workflow.execute_activity(
            names.ACT_LOAD, turn, result_type=ConversationContext,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
            activity_id=f"{turn.turn_id}:load",
        )  # fmt: skip
        queue = workflow.info().task_queue
        consumed = list(turn.inputs)
        new = [user_message(i) for i in turn.inputs]
        reply: str | None = None
        for step in range(names.TURN_MAX_STEPS):
            if self.offered:  # merge point B1: before the next model call
                merged, self.offered = self.offered, []
                self.merged += len(merged)
                consumed += merged
                new += [user_message(i) for i in merged]
            system = [ChatMessage("system", ctx.system)] if ctx.system else []
            messages = bounded(system + ctx.transcript + new)
            out = await workflow.execute_activity(
                names.ACT_LLM_STEP,
                LlmStepInput(turn.employee, turn.turn_id, step, turn.klass, ctx.model, messages,
                             ctx.tools),
                result_type=LlmStepOutput,
                task_queue=names.queue_for(names.LLM_QUEUES[turn.klass], queue),
                activity_id=f"{turn.turn_id}:step-{step}",
                start_to_close_timeout=policies.LLM_ATTEMPT_TIMEOUT,
                schedule_to_close_timeout=policies.LLM_STEP_BUDGET,
                heartbeat_timeout=policies.LLM_HEARTBEAT,
                retry_policy=policies.LLM_RETRY,
            )  # fmt: skip
            new.append(out.message)
            if out.message.tool_calls:  # the whole batch is answered before the next step
                new += [tool_unavailable(c.id, c.name) for c in out.message.tool_calls]
                continue
            reply = out.message.content
            break
        through = max(i.seq for i in consumed)
        saved = await workflow.execute_activity(
            names.ACT_SAVE,
            SaveTurn(turn, new, through, [i.ingress_id for i in consumed], reply),
            result_type=Saved, activity_id=f"{turn.turn_id}:save",
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip
        if saved.outbound_id is not None:
            await workflow.execute_activity(
                names.ACT_SEND, saved.outbound_id, result_type=str,
                task_queue=names.queue_for(names.EGRESS_QUEUE, queue),
                activity_id=f"{turn.turn_id}:send",
                start_to_close_timeout=policies.SEND_TIMEOUT, retry_policy=policies.SEND_RETRY,
            )  # fmt: skip
        return TurnResult(turn.turn_id, through, len(consumed), saved.outbound_id)
