"""What became of an owner message, in the words `waiting` uses (docs/timeline.md "What became
of a message"): its stored status, its reply or what became of the reply (held for review,
declined, expired, failed), and for the admin the gate holding it now: the one `waiting`
gives its input, or the approval its reply waits for; a dead one's reason. `eventosctl chat
--wait` decides from this answer alone, so the CLI, `waiting` and the console agree.
"""

from __future__ import annotations

from typing import Any

from eventos import names
from eventos.db import Conn
from eventos.scheduling.policy import SchedConfig
from eventos.timeline.gates import APPROVAL, approval_gate
from eventos.timeline.waiting import gate_view, input_gate

WAITS = ("queued", "delivered")  # chat_messages.status of a message not consumed yet
BEHIND_HELD = "it waits behind a reply of this conversation held for review"


def reply_status(row: dict[str, Any]) -> str | None:
    """What became of the turn's reply while there is none to read: held for review (its
    approval pending), declined, expired, or failed (the send); None: no reply (yet)."""
    if row["reply"] is not None:
        return None
    state = row["approval_state"]
    if state == names.APPROVAL_PENDING or (state is None and row["send_status"] == "held"):
        return names.REPLY_HELD
    if state == names.APPROVAL_DECLINED:
        return names.REPLY_DECLINED
    if state == names.APPROVAL_EXPIRED or row["send_status"] == "expired":
        return names.REPLY_EXPIRED
    if row["send_status"] == "failed":
        return names.REPLY_FAILED
    return None


def _held_gate(row: dict[str, Any]) -> dict[str, Any]:
    held = {"approval_id": row["approval_id"], "approval_kind": "send",
            "approval_state": row["approval_state"] or names.APPROVAL_PENDING,
            "approval_expires_at": row["approval_expires_at"], "n": row["turn_n"],
            "approval_reason": row["held_reason"], "approval_channel": names.KIND_CHAT}  # fmt: skip
    return gate_view(approval_gate(held, behind=False))


async def message_view(conn: Conn, employee: str, row: dict[str, Any], sched: SchedConfig,
                       admin: bool) -> dict[str, Any]:  # fmt: skip
    """The API's answer for one message (a user reads the status and reply_status, and a gate
    only when it waits behind a reply held for review)."""
    body: dict[str, Any] = {"message_id": row["id"], "status": row["status"],
                            "reply": row["reply"]}  # fmt: skip
    fate = reply_status(row)
    if fate is not None:
        body["reply_status"] = fate
    waits = row["status"] in WAITS and row["reply"] is None
    gate = await input_gate(conn, employee, int(row["ingress_id"]), sched) if waits else None
    if not admin:
        # A user learns that it waits behind a reply held for review, never which approval.
        if gate is not None and gate["code"] == APPROVAL:
            body["gate"] = {"code": APPROVAL, "text": BEHIND_HELD, "until": None}
        return body
    if fate == names.REPLY_HELD and row["approval_id"] is not None:
        body["gate"] = _held_gate(row)
    elif waits:
        body["gate"] = gate
    if row["status"] == "dead":
        body["reason"] = row["delivery_reason"]
    return body
