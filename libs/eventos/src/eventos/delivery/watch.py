"""Watched data in the router (SPEC §10, §15): level-triggered coalescing of
`data.<store>.changed` per (subscription, record).

A change event says which record changed, not its value; the turn reads the current value
(`data_get`). So while an input for a record is still pending in the watcher's stream, a newer
change to it adds nothing: it is counted on that input (`watch_pending`) and its ingress row
is marked `routed` with a `coalesced` note (I3: the drop is a row with a reason). Past
WATCH_SUBJECTS_MAX pending records per subscription, further changes become ONE
`data.<store>.resync` input until the backlog drains. The writer is never woken by its own
write (no self-wake); every other new wake passes the storm guards first (`storm_verdict`).

Only the router runs this, inside its per-source transaction (all changes of one store are
routed by one router at a time, in order), so a (subscription, subject) row has one writer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from eventos import names
from eventos.bus.envelope import encoded_size
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.messaging import storm

# Writes a delivery of (a form of) the row to the subscription; its (stream_key, seq).
Deliver = Callable[[dict[str, Any]], Awaitable[tuple[str, int]]]


@dataclass(frozen=True)
class Change:
    """What a `data.<store>.changed` event says."""

    store: str
    key: str
    version: int
    writer: str


@dataclass(frozen=True)
class Routed:
    """What became of one change for one subscription: whether it reached an input (a new one
    or a pending one it was coalesced into), and the note its ingress row keeps."""

    reached: bool
    note: str | None = None


def change_of(row: dict[str, Any]) -> Change | None:
    """The change an ingress row announces; None for any other event."""
    env = row.get("envelope")
    data = env.get("data") if isinstance(env, dict) else None
    if not isinstance(data, dict):
        return None
    store, key, version = data.get("store"), data.get("key"), data.get("version")
    if not (isinstance(store, str) and isinstance(key, str) and isinstance(version, int)):
        return None
    if row.get("type") != names.data_changed_type(store):
        return None
    return Change(store, key, version, str(data.get("writer") or ""))


async def storm_verdict(conn: Conn, row: dict[str, Any], sub: dict[str, Any], change: Change,
                        now: datetime) -> str:  # fmt: skip
    """STORM GUARD CALL SITE (SPEC §10): a watched-data wake of another employee passes the
    storm guards (`storm.check`: hops and loops on the path, on the router's clock). Any
    verdict other than WATCH_DELIVER drops the wake with that verdict as the ingress row's
    note (a loop's reason)."""
    if not change.writer:
        return names.WATCH_DELIVER
    # Loops only (hops, cycle): the per-edge bucket is not applied to watched data, whose own
    # bound is one input per (subscription, record) and one resync past 200 records (§15).
    verdict = await storm.check(conn, change.writer, str(sub["employee"]), str(row["chain_id"]),
                                int(row["hop"]), storm.path_of(row.get("envelope")), now,
                                rated=False)  # fmt: skip
    if verdict.action == storm.DELIVER:
        return names.WATCH_DELIVER
    return str(verdict.reason)


def resync_row(row: dict[str, Any], change: Change, pending: int) -> dict[str, Any]:
    """The one input standing for a backlog of more than WATCH_SUBJECTS_MAX records."""
    args = json.dumps({"store": change.store}, separators=(",", ":"))
    text = (f"[data resync] more than {names.WATCH_SUBJECTS_MAX} records of store "
            f"{change.store} changed while earlier changes were waiting. List its keys and read "
            f"what you need:\ncall: data_list {args}")  # fmt: skip
    env = dict(row["envelope"])
    kind = names.data_resync_type(change.store)
    env.update(id=f"{env.get('id')}:resync", type=kind, subject=names.WATCH_RESYNC_SUBJECT,
               data={"store": change.store, "pending": pending, "text": text})  # fmt: skip
    return {**row, "type": kind, "envelope": env, "size": encoded_size(env)}


async def _open(conn: Conn, sub_id: int, subject: str) -> tuple[str, int] | None:
    cur = await conn.execute(
        Q["watch_pending_open"], {"subscription_id": sub_id, "subject": subject}
    )
    found = await cur.fetchone()
    return (str(found["stream_key"]), int(found["seq"])) if found else None


async def _coalesce(conn: Conn, sub_id: int, subject: str, version: int) -> None:
    params = {"subscription_id": sub_id, "subject": subject, "version": version}
    await conn.execute(Q["watch_pending_coalesce"], params)


async def _stand(conn: Conn, sub_id: int, subject: str, at: tuple[str, int], version: int) -> None:
    params = {"subscription_id": sub_id, "subject": subject, "stream_key": at[0], "seq": at[1],
              "version": version}  # fmt: skip
    await conn.execute(Q["watch_pending_set"], params)


async def _pending_subjects(conn: Conn, sub_id: int) -> int:
    await conn.execute(Q["watch_pending_prune"], {"subscription_id": sub_id})
    params = {"subscription_id": sub_id, "resync": names.WATCH_RESYNC_SUBJECT}
    cur = await conn.execute(Q["watch_pending_subjects"], params)
    return int((await cur.fetchone() or {})["n"])


async def route_change(conn: Conn, row: dict[str, Any], sub: dict[str, Any], change: Change,
                       deliver: Deliver, now: datetime | None = None) -> Routed:  # fmt: skip
    """Route one change to one watch subscription: skip the writer, coalesce into a pending
    input, deliver a new one, or stand for a large backlog with one resync."""
    who = f"{sub['employee']}/{sub['trigger_name']}"
    if sub["employee"] == change.writer:
        return Routed(False, f"self_wake_skipped: {who} wrote it")
    sub_id = int(sub["id"])
    if at := await _open(conn, sub_id, change.key):
        await _coalesce(conn, sub_id, change.key, change.version)
        return Routed(True, f"coalesced: {who} into {at[0]}#{at[1]}")
    pending = await _pending_subjects(conn, sub_id)
    subject, form = change.key, row
    if pending >= names.WATCH_SUBJECTS_MAX:
        subject, form = names.WATCH_RESYNC_SUBJECT, resync_row(row, change, pending)
        if at := await _open(conn, sub_id, subject):
            await _coalesce(conn, sub_id, subject, change.version)
            return Routed(True, f"coalesced: {who} into the resync {at[0]}#{at[1]}")
    verdict = await storm_verdict(conn, row, sub, change, now or datetime.now(UTC))
    if verdict != names.WATCH_DELIVER:
        return Routed(False, f"{verdict}: {who}")
    at = await deliver(form)
    await _stand(conn, sub_id, subject, at, change.version)
    if subject == names.WATCH_RESYNC_SUBJECT:
        return Routed(True, f"resync: {who} has {pending} records pending, into {at[0]}#{at[1]}")
    return Routed(True)
