"""Alarms in the database (SPEC §10, I10): create, cancel, list, and `fire_due`.

`fire_due` moves a generation's due rows on by compare-and-swap and, in the same transaction,
appends one input per fired occurrence on source `alarm:<employee>` (dedupe
`alarm:<id>[:<occurrence>]`, so an occurrence is appended once however often it is fired: an
emptied Temporal re-armed from here fires each alarm once, EG13). The input names the thread
that set the alarm and takes its reply route (`eventoslane`, `eventosthread`, `eventosroute`)
and carries the setting turn's chain, hop + 1 and path (I8).

Other subsystems set alarms of their own kind through `create_deadline` and settle them through
`cancel_by_ref`: a deadline fires an event of type `eventos.deadline.due` whose `data` holds its
`payload` next to the usual fields, unless its ref's prefix is in DEADLINE_HOOKS: then its owner
decides in `fire_due`'s transaction what the due deadline delivers (a task's `timed_out`), or
that it delivers nothing (the row is cancelled).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from eventos import names
from eventos.alarms.timing import Repeat, humanize, next_occurrence
from eventos.bus.envelope import encoded_size, new_event_id
from eventos.bus.inbox import IngressRecord, append
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import EventOSError, RecordInvalid
from eventos.messaging import ipc

LIST_MAX = 100  # alarms `list_alarms` shows (the rest is counted in `more`)
# What an alarm may carry into its fired input, so that input always fits the bus (64 KB):
# a row the bus refused at fire time would stop its supervisor's alarms.
CARRIED_MAX_BYTES = 32 * 1024
# A due deadline whose ref starts with a key here is its owner's to settle, in fire_due's
# transaction: the hook answers the input to append, or None (nothing is delivered, the row is
# cancelled). The one place where alarms know their owners.
DeadlineHook = Callable[[Conn, dict[str, Any]], Awaitable[IngressRecord | None]]
DEADLINE_HOOKS: dict[str, DeadlineHook] = {ipc.TASK_REF_PREFIX: ipc.task_deadline_due}


class TooManyAlarms(EventOSError):
    """The employee has the most scheduled alarms it may have."""


@dataclass(frozen=True)
class NewAlarm:
    """An alarm to set: where it fires (the setting thread and its reply route), when, and the
    setting turn's causal context. `kind` decides the fired event's type (names.ALARM_TYPES)."""

    id: str
    employee: str
    generation: int
    lane: str
    thread: str
    route: dict[str, Any]
    agent: str
    text: str
    due_at: datetime
    chain_id: str
    hop: int = 0
    path: list[str] = field(default_factory=list)
    causation_id: str | None = None
    kind: str = names.ALARM_KIND
    ref: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    if_late: str = names.IF_LATE_FIRE
    skip_after_s: float | None = None
    cancel_on: str | None = None
    repeat: Repeat | None = None


def alarm_id(turn_id: str, call_id: str) -> str:
    """The id of the alarm a tool call sets: a hash of (turn, call), so a retry makes one row."""
    return "al_" + hashlib.sha256(f"{turn_id}:{call_id}".encode()).hexdigest()[:16]


def deadline_id(employee: str, generation: int, kind: str, ref: str) -> str:
    """The id of a deadline: a hash of its owner's reference (set twice, one row)."""
    digest = hashlib.sha256(f"{employee}:{generation}:{kind}:{ref}".encode()).hexdigest()
    return "dl_" + digest[:16]


async def create(conn: Conn, alarm: NewAlarm, cap: int = names.ALARMS_MAX_PER_EMPLOYEE) -> None:
    """Store a scheduled alarm (in the caller's transaction); TooManyAlarms at `cap`
    scheduled ones of its kind in the generation, RecordInvalid past CARRIED_MAX_BYTES. The
    same id again changes nothing."""
    carried = json.dumps([alarm.text, alarm.route, alarm.payload, alarm.path], default=str)
    if len(carried.encode()) > CARRIED_MAX_BYTES:
        raise RecordInvalid(f"an alarm carries at most {CARRIED_MAX_BYTES} bytes of text, "
                            "route, payload and path")  # fmt: skip
    params = {"employee": alarm.employee, "generation": alarm.generation, "kind": alarm.kind}
    await conn.execute(Q["alarms_lock_employee"], params)
    cur = await conn.execute(Q["alarms_count_scheduled"], params)
    if int((await cur.fetchone() or {"n": 0})["n"]) >= cap:
        raise TooManyAlarms(
            f"{alarm.employee} has {cap} scheduled alarms, the most it may have; cancel one first"
        )
    await conn.execute(Q["alarm_insert"], {
        **params, "id": alarm.id, "ref": alarm.ref, "lane": alarm.lane, "thread": alarm.thread,
        "route": Jsonb(alarm.route), "agent": alarm.agent, "text": alarm.text,
        "payload": Jsonb(alarm.payload), "due_at": alarm.due_at, "if_late": alarm.if_late,
        "skip_after_s": alarm.skip_after_s, "cancel_on": alarm.cancel_on,
        "repeat": Jsonb(alarm.repeat.doc()) if alarm.repeat else None,
        "chain_id": alarm.chain_id, "hop": alarm.hop, "path": Jsonb(alarm.path),
        "causation_id": alarm.causation_id,
    })  # fmt: skip


async def create_deadline(conn: Conn, *, employee: str, generation: int, ref: str,
                          due_at: datetime, lane: str, thread: str, route: dict[str, Any],
                          agent: str, text: str, chain_id: str, hop: int = 0,
                          path: list[str] | None = None, payload: dict[str, Any] | None = None,
                          cap: int = 1000) -> str:  # fmt: skip
    """Set a deadline (kind `deadline`) in the caller's transaction; returns its id. At
    `due_at` an `eventos.deadline.due` input with `data = {text, alarm_id, scheduled_for,
    fired_at, lateness_s, ref, **payload}` lands in (lane, thread) with `route`. Settle it
    with `cancel_by_ref` before then (the same ref). Never skipped when late; the supervisor
    must be told (`signal_changed`) after the transaction commits."""
    did = deadline_id(employee, generation, names.DEADLINE_KIND, ref)
    await create(conn, NewAlarm(
        id=did, employee=employee, generation=generation, lane=lane, thread=thread, route=route,
        agent=agent, text=text, due_at=due_at, chain_id=chain_id, hop=hop, path=path or [],
        kind=names.DEADLINE_KIND, ref=ref, payload={"ref": ref, **(payload or {})},
    ), cap=cap)  # fmt: skip
    return did


async def cancel_by_ref(conn: Conn, employee: str, ref: str,
                        kind: str = names.DEADLINE_KIND) -> int:  # fmt: skip
    """Cancel the scheduled alarms of `kind` with `ref` (a task settled before its deadline);
    returns how many. No Signal is needed: the supervisor finds nothing due. One that
    `fire_due` is firing right now is left to it (a hooked ref: its owner's hook sees the
    settled owner and cancels it)."""
    cur = await conn.execute(Q["alarms_cancel_by_ref"],
                             {"employee": employee, "kind": kind, "ref": ref})  # fmt: skip
    return len(await cur.fetchall())


async def cancel(conn: Conn, employee: str, generation: int, lane: str, thread: str,
                 aid: str) -> str | None:  # fmt: skip
    """Cancel one of the alarms the conversation (lane, thread) of the generation set: its
    status after (`cancelled`, or the final state it had reached); None when it set no such
    alarm (another conversation's alarm is not there for it, EG17)."""
    params = {"employee": employee, "generation": generation, "lane": lane, "thread": thread,
              "id": aid, "kind": names.ALARM_KIND}  # fmt: skip
    cur = await conn.execute(Q["alarm_cancel"], params)
    if await cur.fetchone() is not None:
        return names.ALARM_CANCELLED
    cur = await conn.execute(Q["alarm_get"], params)
    row = await cur.fetchone()
    if row is None or row["kind"] != names.ALARM_KIND:
        return None
    return str(row["status"])


async def listed(conn: Conn, employee: str, generation: int, lane: str,
                 thread: str) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    """The scheduled alarms the conversation (lane, thread) of the generation set and those
    settled in the last day (at most LIST_MAX, soonest first), and how many there are in all."""
    cur = await conn.execute(Q["alarms_list"],
                             {"employee": employee, "generation": generation, "lane": lane,
                              "thread": thread, "limit": LIST_MAX})  # fmt: skip
    rows = await cur.fetchall()
    out = []
    for r in rows:
        item = {"id": r["id"], "text": r["text"], "due_at": r["due_at"].isoformat(),
                "status": r["status"]}  # fmt: skip
        if r["repeat"]:
            item["repeat"] = r["repeat"]
        out.append(item)
    return out, int(rows[0]["total"]) if rows else 0


async def next_due(conn: Conn, employee: str, generation: int) -> datetime | None:
    """The earliest scheduled alarm of the generation."""
    cur = await conn.execute(Q["alarms_next_due"], {"employee": employee,
                                                    "generation": generation})  # fmt: skip
    row = await cur.fetchone()
    return row["due_at"] if row else None


async def cancel_follow_ups(conn: Conn, employee: str, generation: int, lane: str,
                            thread: str) -> None:  # fmt: skip
    """An inbound message reached (lane, thread): its `cancel_on: inbound` alarms end."""
    await conn.execute(Q["alarms_cancel_follow_ups"], {
        "employee": employee, "generation": generation, "lane": lane, "thread": thread,
    })  # fmt: skip


async def cancel_generation(conn: Conn, employee: str, generation: int) -> None:
    """A retired generation's alarms never fire."""
    await conn.execute(Q["alarms_cancel_generation"],
                       {"employee": employee, "generation": generation})  # fmt: skip


@dataclass
class Fired:
    """What one `fire_due` did."""

    fired: int = 0
    missed: int = 0
    cancelled: int = 0  # deadlines their owner settled at fire time (DEADLINE_HOOKS)
    lateness_s: list[float] = field(default_factory=list)


def fired_text(row: dict[str, Any], lateness_s: float, note_after_s: float) -> str:
    """The text the model reads; a late alarm says how late it is (SPEC §15)."""
    text = str(row["text"])
    if lateness_s <= note_after_s:
        return text
    due = row["due_at"].isoformat()
    return f"{text}\n[late: due at {due}, fired {humanize(lateness_s)} late]"


def fired_record(row: dict[str, Any], lateness_s: float, note_after_s: float) -> IngressRecord:
    """The input of one fired occurrence, placed in the thread that set the alarm."""
    event_id, now, repeating = new_event_id(), row["now"], bool(row["repeat"])
    event_type = names.ALARM_TYPES[str(row["kind"])]
    dedupe = f"alarm:{row['id']}" + (f":{row['occurrence']}" if repeating else "")
    data = {
        **(row["payload"] or {}), "text": fired_text(row, lateness_s, note_after_s),
        "alarm_id": row["id"], "scheduled_for": row["due_at"].isoformat(),
        "fired_at": now.isoformat(), "lateness_s": round(lateness_s, 3),
    }  # fmt: skip
    if repeating:
        data["occurrence"] = int(row["occurrence"])
    envelope = {
        "specversion": "1.0", "id": event_id, "source": f"/employees/{row['employee']}/alarms",
        "type": event_type, "subject": row["id"], "datacontenttype": "application/json",
        "data": data, names.ATTR_LANE: row["lane"], names.ATTR_THREAD: row["thread"],
        names.ATTR_ROUTE: row["route"], names.ATTR_PATH: list(row["path"] or []),
    }  # fmt: skip
    return IngressRecord(
        source_key=names.source_key(names.SOURCE_ALARM, str(row["employee"])),
        dedupe_key=dedupe, type=event_type, chain_id=str(row["chain_id"]), envelope=envelope,
        size=encoded_size(envelope), klass=names.C4_BACKGROUND, hop=int(row["hop"]) + 1,
        causation_id=row["causation_id"],
    )  # fmt: skip


async def _missed(conn: Conn, row: dict[str, Any], lateness_s: float) -> None:
    """A missed occurrence raises an attention item (its stream's user sees it too)."""
    key = names.stream_key(row["employee"], row["generation"], row["lane"], row["thread"])
    occurrence = f":{row['occurrence']}" if row["repeat"] else ""
    await conn.execute(Q["attention_raise"], {
        "employee": row["employee"], "kind": names.ATTENTION_MISSED_ALARM, "severity": "warning",
        "ref": f"{key}#alarm:{row['id']}{occurrence}",
        "detail": (f"alarm {row['id']} due at {row['due_at'].isoformat()} was skipped: "
                   f"{humanize(lateness_s)} late, past its {row['if_late']}"),
    })  # fmt: skip


def deadline_hook(row: dict[str, Any]) -> DeadlineHook | None:
    """The owner's hook of a due deadline, by its ref's prefix (None: it fires as it is)."""
    if row["kind"] != names.DEADLINE_KIND or not row["ref"]:
        return None
    ref = str(row["ref"])
    return next((h for prefix, h in DEADLINE_HOOKS.items() if ref.startswith(prefix)), None)


async def _settle(conn: Conn, row: dict[str, Any], status: str, next_at: datetime) -> bool:
    """Move a taken occurrence on (compare-and-swap); False when someone else did first."""
    cur = await conn.execute(Q["alarm_settle"], {
        "id": row["id"], "status": status, "next_due": next_at,
        "fired": status not in (names.ALARM_MISSED, names.ALARM_CANCELLED),
        "occurrence": row["occurrence"], "now": row["now"],
    })  # fmt: skip
    return await cur.fetchone() is not None


async def _fire_hooked(conn: Conn, row: dict[str, Any], hook: DeadlineHook,
                       done: Fired) -> IngressRecord | None:  # fmt: skip
    """A deadline its owner settles: the hook's input fires it, none cancels it. The row is
    locked (alarms_take_due), so its settle holds; the hook's own compare-and-swap makes its
    input once."""
    record = await hook(conn, row)
    await _settle(conn, row, names.ALARM_FIRED if record else names.ALARM_CANCELLED,
                  row["due_at"])  # fmt: skip
    if record is None:
        done.cancelled += 1
        return None
    done.fired += 1
    done.lateness_s.append(max(0.0, (row["now"] - row["due_at"]).total_seconds()))
    return record


async def fire_due(conn: Conn, employee: str, generation: int, zone: str, *,
                   limit: int = 100, note_after_s: float = 60.0,
                   now: datetime | None = None) -> Fired:  # fmt: skip
    """Fire (or miss) up to `limit` due occurrences of a running generation, in one
    transaction with their inputs; a repeating alarm is scheduled at its next occurrence.
    The clock is the transaction's, unless the caller passes one (a simulated bench)."""
    done, records = Fired(), []
    async with conn.transaction():
        cur = await conn.execute(Q["alarms_take_due"], {"employee": employee,
                                                        "generation": generation,
                                                        "limit": limit, "now": now})  # fmt: skip
        for row in await cur.fetchall():
            hook = deadline_hook(row)
            if hook is not None:
                if (hooked := await _fire_hooked(conn, row, hook, done)) is not None:
                    records.append(hooked)
                continue
            lateness = max(0.0, (row["now"] - row["due_at"]).total_seconds())
            missed = row["skip_after_s"] is not None and lateness > float(row["skip_after_s"])
            repeat = Repeat.from_doc(row["repeat"])
            status = names.ALARM_MISSED if missed else names.ALARM_FIRED
            next_at = row["due_at"]
            if repeat is not None:
                status = names.ALARM_SCHEDULED
                next_at = next_occurrence(repeat, row["due_at"], row["now"], zone)
            if not await _settle(conn, row, status, next_at):
                continue  # someone else moved it on first
            if missed:
                await _missed(conn, row, lateness)
                done.missed += 1
            else:
                records.append(fired_record(row, lateness, note_after_s))
                done.fired += 1
                done.lateness_s.append(lateness)
        await append(conn, records)
    return done
