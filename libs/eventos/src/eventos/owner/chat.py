"""Owner chat (SPEC §6.2): the message and its ingress row in one transaction.

Every message belongs to an audience: a user's name, or `owner` for the admin. Sessions, client
ids, message ids and the event stream are all per audience. The pending bound is per session
for the admin, and over all of a user's sessions for a user; a user past it, or past its daily
spend cap with the employee, is refused (QueueFull, 429) and nothing is saved. A user's
message carries its thread and class for the router (only the owner API writes `chat:*`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from eventos import names
from eventos.bus.envelope import encoded_size
from eventos.bus.inbox import Accepted, IngressRecord, append
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.employees.lifecycle import get as get_employee
from eventos.errors import Conflict, InputInvalid, NotFound, QueueFull
from eventos.owner.users import OWNER, User
from eventos.scheduling import ledger

MAX_TEXT_BYTES = 32 * 1024
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # the admin reads all of its audience's history


@dataclass(frozen=True)
class Queued:
    """An owner message waiting for its turn."""

    message_id: int
    status: str
    duplicate: bool


def chat_envelope(
    employee: str,
    session: str,
    client_message_id: str,
    text: str,
    event_id: str,
    audience: str = OWNER,
    user: User | None = None,
) -> dict[str, object]:
    data: dict[str, object] = {
        "session": session,
        "client_message_id": client_message_id,
        "text": text,
        "audience": audience,
    }
    if user is not None:  # the router places it on the user's thread, at the user's class
        data["thread"], data["class"] = user.thread, user.klass
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": f"/v1/employees/{employee}/chat",
        "type": names.TYPE_CHAT_MESSAGE,
        "subject": session,
        "datacontenttype": "application/json",
        "data": data,
    }


def dedupe_key(audience: str, session: str, client_message_id: str,
               user_id: str | None = None) -> str:  # fmt: skip
    """The message's ingress key: the admin's as before users existed; a user's under its name
    (which holds no `/`) and its record's id, so no user's key meets another user's, nor a
    re-created name's the old holder's."""
    if audience == OWNER:
        return f"{session}:{client_message_id}"
    if user_id is None:
        return f"@{audience}/{session}:{client_message_id}"
    return f"@{audience}#{user_id}/{session}:{client_message_id}"


async def send(
    conn: Conn,
    employee: str,
    client_message_id: str,
    text: str,
    session: str = names.DEFAULT_SESSION,
    user: User | None = None,
) -> Queued:
    """Queue one message of the admin, or of `user`; QueueFull (nothing saved) past 100
    pending in the admin's session or in all of the user's, or past the user's daily cap."""
    if not client_message_id or len(client_message_id) > 128:
        raise InputInvalid("client_message_id", "must be 1 to 128 characters")
    if not session or len(session) > 64:
        raise InputInvalid("session", "must be 1 to 64 characters")
    if not text.strip():
        raise InputInvalid("text", "must not be empty")
    if len(text.encode()) > MAX_TEXT_BYTES:
        raise InputInvalid("text", f"is over {MAX_TEXT_BYTES} bytes")
    row = await get_employee(conn, employee)
    if row["state"] not in names.ROUTABLE_GENERATION_STATES:
        raise Conflict(f"{employee!r} is not started")
    cur = await conn.execute(Q["chat_trigger_live"], {"employee": employee})
    if not (await cur.fetchone() or {}).get("takes"):  # nothing would ever consume it
        raise Conflict(
            f"{employee!r} takes no chat: its spec has no chat trigger "
            "(add `- {kind: chat}` to its triggers, apply, reset and start)"
        )
    audience = OWNER if user is None else user.name
    user_id = None if user is None else user.id
    params = {
        "employee": employee,
        "audience": audience,
        "session": session,
        "client_message_id": client_message_id,
        "lock_session": session if user is None else "",
        "per_session": user is None,
        "user_id": user_id,
    }
    async with conn.transaction():
        await conn.execute(Q["chat_session_lock"], params)
        cur = await conn.execute(Q["chat_existing"], params)
        existing = await cur.fetchone()
        if existing is not None:
            return Queued(int(existing["id"]), str(existing["status"]), duplicate=True)
        cur = await conn.execute(
            Q["chat_pending_count"], {**params, "cap": names.OWNER_CHAT_PENDING_MAX}
        )
        if int((await cur.fetchone() or {})["n"]) >= names.OWNER_CHAT_PENDING_MAX:
            raise QueueFull(
                f"queue_full: {names.OWNER_CHAT_PENDING_MAX} messages are already pending",
                retry_after_s=names.CHAT_RETRY_AFTER_S,
            )
        if user is not None:
            await _check_allowance(conn, employee, user)
        event_id = uuid.uuid4().hex
        envelope = chat_envelope(employee, session, client_message_id, text, event_id, audience,
                                 user)  # fmt: skip
        record = IngressRecord(
            source_key=names.source_key(names.SOURCE_CHAT, employee),
            dedupe_key=dedupe_key(audience, session, client_message_id, user_id),
            type=names.TYPE_CHAT_MESSAGE,
            chain_id=event_id,
            envelope=envelope,
            size=encoded_size(envelope),
            klass=names.C1_OWNER if user is None else user.klass,
        )
        (outcome,) = await append(conn, [record])
        if not isinstance(outcome, Accepted):
            raise Conflict("the message's ingress key was already used")
        cur = await conn.execute(
            Q["chat_insert"], {**params, "text": text, "ingress_id": outcome.id}
        )
        inserted = await cur.fetchone() or {}
    return Queued(int(inserted["id"]), str(inserted["status"]), duplicate=False)


async def _check_allowance(conn: Conn, employee: str, user: User) -> None:
    """QueueFull once the user spent its daily cap with the employee (until the period ends)."""
    mine = await ledger.allowance(conn, employee, user.thread, user.daily_usd)
    if mine.spent:
        left = (mine.period_end - datetime.now(UTC)).total_seconds() if mine.period_end else 0
        raise QueueFull(
            f"spend_cap: your daily spend with {employee!r} ({mine.cap:.4f} USD) is reached",
            retry_after_s=max(left, names.CHAT_RETRY_AFTER_S),
        )


async def message(
    conn: Conn, employee: str, message_id: int, audience: str = OWNER, since: datetime = EPOCH
) -> dict[str, Any]:
    """One message of `audience` (made at or after `since`: a user's record's creation) with
    its reply (None until the turn that consumed it answered); another's is not found."""
    params = {"employee": employee, "id": message_id, "audience": audience, "since": since}
    cur = await conn.execute(Q["chat_message_get"], params)
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no message {message_id} for {employee!r}")
    return row


async def events_after(
    conn: Conn,
    employee: str,
    session: str,
    after: int,
    audience: str = OWNER,
    since: datetime = EPOCH,
) -> list[dict[str, Any]]:
    """This session's run events and replies placed after `after` (a stream place) and made
    at or after `since`, in order."""
    params = {"employee": employee, "session": session, "after": after, "audience": audience,
              "since": since}  # fmt: skip
    cur = await conn.execute(Q["chat_events_after"], params)
    return await cur.fetchall()
