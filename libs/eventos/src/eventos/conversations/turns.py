"""Turns, database side: the conversation's context, the consuming save, the outbox.

The consuming save (SPEC §8 step 5) appends the turn's messages to the transcript
(eventos.conversations.transcripts), settles the consumed deliveries, advances `consumed_seq`
(the watermark below which every input is settled) and queues the reply in one transaction. It
refuses when the turn is no longer the running one, so a cancelled or interrupted turn never saves
late.
Owner-chat runs also write their events (`run.start`, `run.input_merged`) for the session's
event stream.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from eventos import names, timeline
from eventos.bus.jsonsafe import storable_text
from eventos.contracts import (
    ConversationContext,
    DeadLetter,
    DeliveryItem,
    ModelRef,
    ReloadInputs,
    RunEvent,
    Saved,
    SaveTurn,
    SkipInputs,
    TranscriptRef,
    TurnInput,
)
from eventos.conversations import transcripts
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict, NotFound
from eventos.outbox import approvals
from eventos.outbox.keys import OutboxKeys
from eventos.owner.users import OWNER
from eventos.runtime.metrics import count_dead
from eventos.tools.registry import offered


async def record_run_event(conn: Conn, event: RunEvent) -> None:
    """Mark the owner messages taken by the run and tell the session (once per event)."""
    async with conn.transaction():
        taken = {"turn_id": event.turn_id, "ingress_ids": event.ingress_ids}
        cur = await conn.execute(Q["chat_messages_taken"], taken)
        message_ids = sorted(int(r["id"]) for r in await cur.fetchall())
        inputs = ",".join(str(i) for i in sorted(event.ingress_ids))
        await conn.execute(Q["chat_event_insert"], {
            "employee": event.employee, "audience": event.audience, "session": event.session,
            "kind": event.kind,
            "turn_id": event.turn_id, "dedupe_key": f"{event.kind}:{event.turn_id}:{inputs}",
            "message_ids": message_ids,
        })  # fmt: skip


def chat_session(turn: TurnInput) -> str | None:
    """The owner-chat session a turn answers, if it answers one."""
    if turn.route.get("kind") != names.KIND_CHAT:
        return None
    return str(turn.route.get("session") or "owner")


def chat_audience(turn: TurnInput) -> str:
    """Whose owner chat a turn answers: a user's name, or `owner` (the admin)."""
    return str(turn.route.get("audience") or OWNER)


async def load(conn: Conn, turn: TurnInput) -> ConversationContext:
    """The agent's model, prompt and tools from the frozen spec, and the transcript; an
    owner-chat run's start is told to its session here (no extra activity on the hot path)."""
    params = {"employee": turn.employee, "generation": turn.generation, "agent": turn.agent,
              "thread": turn.thread}  # fmt: skip
    cur = await conn.execute(Q["conversation_load"], params)
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no generation {turn.employee} g{turn.generation}")
    agents = {a["name"]: a for a in row["spec"]["spec"]["agents"]}
    agent = agents.get(turn.agent)
    if agent is None:
        raise NotFound(f"no agent {turn.agent!r} in {turn.employee} g{turn.generation}")
    m = agent["model"]
    options = m.get("options") or {}
    model = ModelRef(m["provider"], m["name"], m.get("credential"), m.get("base_url"),
                     m.get("endpoint"), options.get("token_limit_param"))  # fmt: skip
    await timeline.turn_started(conn, turn)
    n, total = int(row["transcript_n"] or 0), int(row["transcript_total"] or 0)
    stored = TranscriptRef(turn.generation, turn.agent, turn.thread, n, total)
    session = chat_session(turn)
    if session is not None:
        await record_run_event(
            conn,
            RunEvent(
                turn.employee,
                session,
                turn.turn_id,
                names.RUN_START,
                [i.ingress_id for i in turn.inputs],
                chat_audience(turn),
            ),
        )
    tools = offered(list(agent.get("tools") or []))
    approve = list(((row["spec"]["spec"].get("approvals") or {}).get("tools")) or [])
    return ConversationContext(model=model, system=agent.get("system", ""), tools=tools,
                               stored=stored, approve_tools=approve)  # fmt: skip


def reply_key(turn: TurnInput, consumed_ingress_ids: list[int]) -> str:
    """SPEC §11: a reply's key hashes thread, route, consumed input set and node."""
    doc = {"thread": turn.stream_key, "route": turn.route,
           "inputs": sorted(consumed_ingress_ids), "node": "reply"}  # fmt: skip
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _outbound_row(turn: TurnInput, req: SaveTurn, keys: OutboxKeys) -> dict[str, Any]:
    """The reply's outbox row; its recipient sealed to the row (never stored in the clear)."""
    key = reply_key(turn, req.consumed_ingress_ids)
    channel = turn.route.get("kind") in names.CHANNEL_KINDS
    recipient = turn.route.get("recipient" if channel else "session")
    sealed = None
    if recipient is not None:
        sealed = keys.seal(str(recipient), employee=turn.employee, idempotency_key=key)
    return {
        "key": key, "employee": turn.employee, "thread": turn.stream_key,
        "turn_id": turn.turn_id, "account": turn.route.get("account") if channel else None,
        "recipient": sealed.blob if sealed else None,
        "recipient_key_id": sealed.key_id if sealed else None,
        "kind": turn.route.get("kind", names.KIND_CHAT), "class": turn.klass, "body": req.reply,
        "audience": _audience_column(turn),
    }  # fmt: skip


def storable_save(req: SaveTurn) -> SaveTurn:
    """The save with the model's text made storable (NUL → U+FFFD) in the transcript, the
    reply's outbox body and so the timeline's entries written from them."""
    reply = None if req.reply is None else storable_text(req.reply)
    messages = [transcripts.storable(m) for m in req.new_messages]
    return dataclasses.replace(req, new_messages=messages, reply=reply)


async def save(conn: Conn, req: SaveTurn, keys: OutboxKeys) -> Saved:
    """The consuming save; idempotent for a retried step (same turn, same inputs)."""
    req = storable_save(req)
    turn = req.turn
    async with conn.transaction():
        cur = await conn.execute(Q["turn_lock"], {"turn_id": turn.turn_id})
        row = await cur.fetchone()
        if row is None or row["status"] not in ("running", "done"):
            raise Conflict(f"turn {turn.turn_id} no longer runs; its save is refused")
        already = row["status"] == "done"
        if not already:
            conversation = TranscriptRef(turn.generation, turn.agent, turn.thread, 0, 0)
            await transcripts.append(conn, turn.employee, conversation, turn.turn_id,
                                     req.new_messages)  # fmt: skip
            seqs = {"stream_key": turn.stream_key, "seqs": req.consumed_seqs}
            await conn.execute(Q["deliveries_consume"], seqs)
            await conn.execute(Q["stream_consume"], seqs)
            answered = {"turn_id": turn.turn_id, "ingress_ids": req.consumed_ingress_ids}
            await conn.execute(Q["chat_messages_answered"], answered)
            done = {"turn_id": turn.turn_id, "through": max(req.consumed_seqs), **seqs}
            await conn.execute(Q["turn_done"], done)
        outbound_id, kind, account = None, None, None
        # A `peer_` thread has no reply route (SPEC §8): its final text stays in the transcript.
        peer = turn.thread.startswith(names.PEER_THREAD_PREFIX)
        approval = None
        if req.reply is not None and turn.route.get("reply") and not peer:
            row = _outbound_row(turn, req, keys)
            cur = await conn.execute(Q["outbound_insert"], row)
            outbound_id, kind = int((await cur.fetchone() or {})["id"]), str(row["kind"])
            account = row["account"]
            policy = await approvals.policy(conn, turn.employee, turn.generation)
            recipient = turn.route.get("recipient" if kind in names.CHANNEL_KINDS else "session")
            held = policy.holds(kind, req.reply, None if recipient is None else str(recipient))
            if held:
                approval = await approvals.hold(
                    conn, outbound_id=outbound_id, employee=turn.employee,
                    generation=turn.generation, thread=turn.stream_key, turn_id=turn.turn_id,
                    audience=policy.decider(held, row["audience"]),
                    expire_after_h=policy.expire_after_h, reason=",".join(held),
                )  # fmt: skip
                if kind == names.KIND_CHAT:
                    # The chat is told its reply waits, never the draft nor what held it.
                    await conn.execute(Q["chat_held_notice_insert"], {
                        "employee": turn.employee, "audience": chat_audience(turn),
                        "session": chat_session(turn), "turn_id": turn.turn_id,
                        "dedupe_key": f"held:{outbound_id}", "text": names.HELD_FOR_REVIEW,
                    })  # fmt: skip
    return Saved(outbound_id, kind, account, approval)


def _audience_column(turn: TurnInput) -> str | None:
    """The outbox row's audience: the user whose chat it answers; NULL for the admin's."""
    if turn.route.get("kind") != names.KIND_CHAT:
        return None
    audience = chat_audience(turn)
    return None if audience == OWNER else audience


async def dead_letter(conn: Conn, req: DeadLetter) -> None:
    """Settle a twice-failed turn's inputs as dead (the stream moves on) and tell the owner."""
    async with conn.transaction():
        params = {"stream_key": req.stream_key, "seqs": req.seqs, "reason": req.reason[:500],
                  "turn_id": req.turn_id}  # fmt: skip
        dead = await conn.execute(Q["deliveries_dead_letter"], params)
        await conn.execute(Q["chat_messages_dead"], {"ingress_ids": req.ingress_ids})
        await conn.execute(Q["stream_consume"], {"stream_key": req.stream_key})
        await conn.execute(Q["attention_raise"], {
            "employee": req.employee, "kind": names.ATTENTION_DEAD_INPUT, "severity": "error",
            "ref": f"{req.stream_key}#{req.seqs[0]}-{req.seqs[-1]}",
            "detail": f"turn {req.turn_id} failed twice: {req.reason}"[:1000],
        })  # fmt: skip
    count_dead(req.reason, dead.rowcount)


async def skip_inputs(conn: Conn, req: SkipInputs) -> None:
    """Settle ticks that arrived while their trigger's turn ran (`on_busy: skip`)."""
    async with conn.transaction():
        params = {"stream_key": req.stream_key, "seqs": req.seqs, "reason": req.reason[:500]}
        await conn.execute(Q["deliveries_skip"], params)
        await conn.execute(Q["stream_consume"], {"stream_key": req.stream_key})


async def reload_inputs(conn: Conn, req: ReloadInputs) -> list[DeliveryItem]:
    """The delivered, unconsumed inputs of a stream in (after, through], in seq order."""
    params = {"stream_key": req.stream_key, "after": req.after, "through": req.through}
    cur = await conn.execute(Q["deliveries_delivered_between"], params)
    return [DeliveryItem.from_row(r) for r in await cur.fetchall()]
