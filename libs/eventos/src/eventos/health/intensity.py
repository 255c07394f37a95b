"""Restart intensity per thread (SPEC §12, OTP's MaxR/MaxT), on the failed turns in `turns`.

Each failed turn is counted once on its thread (`thread_health`), in the transaction that
locks the thread's stream row. With `backoff_after` (3) failed turns within `backoff_window_s`
(10 minutes) the thread backs off `backoff_s` (1, 5, then 30 minutes: the step grows while
backoffs come within an hour of the one before); with `quarantine_after` (5) within
`quarantine_window_s` (an hour) it is quarantined until the owner releases it. Either way the
relay holds the stream (`hold_reason` `backoff` with `hold_until`, or `quarantined`), so new
inputs wait in the database, and admission refuses the thread's turns, so the inputs its entity
already holds wait too. Quarantined inputs are never dead-lettered for it; the release (the
`release` action of the `thread_quarantined` item) lets them flow again in order and starts a
new failure window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from eventos import names
from eventos.contracts import Admission, AdmitRequest
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict
from eventos.runtime.metrics import THREAD_HOLDS
from eventos.settings import SupervisionSettings

STEP_MEMORY = timedelta(hours=1)  # a backoff within this of the last one is the next step


@dataclass(frozen=True)
class Verdict:
    """What a failed turn brought its thread: a hold (None: none) and until when."""

    hold: str | None
    until: datetime | None = None


def verdict(row: dict[str, Any], cfg: SupervisionSettings) -> Verdict:
    """The hold a thread's failed-turn counts call for (before this turn's own hold)."""
    if row["quarantined_at"] is not None or row["in_quarantine_window"] >= cfg.quarantine_after:
        return Verdict(names.HOLD_QUARANTINED)
    if row["in_backoff_window"] < cfg.backoff_after:
        return Verdict(None)
    now: datetime = row["now"]
    step = next_step(row, now)
    return Verdict(names.HOLD_BACKOFF, now + timedelta(seconds=backoff_of(cfg, step)))


def next_step(row: dict[str, Any], now: datetime) -> int:
    """1 for a first backoff, one more when the last began within the hour."""
    last = row["backoff_at"]
    return int(row["backoff_step"]) + 1 if last is not None and now - last < STEP_MEMORY else 1


def backoff_of(cfg: SupervisionSettings, step: int) -> float:
    """The backoff of a step: 1, 5, then 30 minutes (the last one repeats)."""
    return cfg.backoff_s[min(step, len(cfg.backoff_s)) - 1]


async def record_failure(conn: Conn, turn_id: str, cfg: SupervisionSettings) -> str | None:
    """Count a failed turn on its thread once; back the thread off or quarantine it. The hold
    the thread is under now (`quarantined`, `backoff`) or None."""
    async with conn.transaction():
        cur = await conn.execute(Q["thread_failure_facts"], {
            "turn_id": turn_id, "backoff_window_s": cfg.backoff_window_s,
            "quarantine_window_s": cfg.quarantine_window_s,
        })  # fmt: skip
        row = await cur.fetchone()
        if row is None:
            return None  # not a failed turn (or its stream is gone)
        if row["counted"]:  # a retried activity: counted already
            return _current(row)
        found = verdict(row, cfg)
        await _count(conn, row, turn_id, found)
        if found.hold is None:
            return None
        hold = {"stream_key": row["stream_key"], "hold": found.hold, "until": found.until}
        await conn.execute(Q["thread_hold"], hold)
        if found.hold == names.HOLD_QUARANTINED and row["quarantined_at"] is None:
            await _raise_quarantined(conn, row, cfg)
    if found.hold == names.HOLD_QUARANTINED and row["quarantined_at"] is not None:
        return found.hold  # already quarantined: nothing newly held
    THREAD_HOLDS.labels(found.hold).inc()
    return found.hold


def _current(row: dict[str, Any]) -> str | None:
    if row["quarantined_at"] is not None:
        return names.HOLD_QUARANTINED
    until = row["backoff_until"]
    return names.HOLD_BACKOFF if until is not None and until > row["now"] else None


async def _count(conn: Conn, row: dict[str, Any], turn_id: str, found: Verdict) -> None:
    step, at, until = row["backoff_step"], row["backoff_at"], row["backoff_until"]
    if found.hold == names.HOLD_BACKOFF:
        step, at, until = next_step(row, row["now"]), row["now"], found.until
    quarantined = row["quarantined_at"]
    if found.hold == names.HOLD_QUARANTINED and quarantined is None:
        quarantined = row["now"]
    await conn.execute(Q["thread_failure_counted"], {
        "stream_key": row["stream_key"], "employee": row["employee"], "turn_id": turn_id,
        "backoff_step": step, "backoff_at": at, "backoff_until": until,
        "quarantined_at": quarantined,
    })  # fmt: skip


async def _raise_quarantined(conn: Conn, row: dict[str, Any], cfg: SupervisionSettings) -> None:
    minutes = int(cfg.quarantine_window_s // 60)
    await conn.execute(Q["attention_raise_action"], {
        "employee": row["employee"], "kind": names.ATTENTION_THREAD_QUARANTINED,
        "severity": "error", "ref": row["stream_key"], "action": names.ACTION_RELEASE,
        "thread": row["thread"],
        "detail": f"{row['in_quarantine_window']} turns of this thread failed within "
        f"{minutes} minutes: it is quarantined and its inputs are held (none is lost). Fix the "
        "cause, then take the `release` action: they run again in order",
    })  # fmt: skip


def admission_refusal(req: AdmitRequest, row: dict[str, Any]) -> Admission | None:
    """Admission's gate for a thread under its restart intensity, and for background work of
    a degraded employee: a refusal, or None to go on."""
    if row.get("quarantined"):
        return Admission(granted=False, reason="the thread is quarantined",
                         gate=names.GATE_QUARANTINED)  # fmt: skip
    left = row.get("backoff_left_s")
    if left is not None and left > 0:
        return Admission(granted=False, reason=f"the thread backs off for {left:.0f} s",
                         gate=names.GATE_BACKOFF, retry_after_s=float(left))  # fmt: skip
    if row.get("degraded") and req.klass in (names.C3_INTERNAL, names.C4_BACKGROUND):
        return Admission(granted=False, reason="the employee is degraded",
                         gate=names.GATE_DEGRADED)  # fmt: skip
    return None


async def lock_thread(conn: Conn, stream_key: str) -> None:
    """Lock a thread's stream, as the supervision pass does before it touches the thread's item
    (the one order that cannot deadlock)."""
    await conn.execute(Q["stream_lock"], {"stream_key": stream_key})


async def release(conn: Conn, stream_key: str) -> dict[str, Any]:
    """Release a quarantined thread (its stream locked by the caller): its held inputs flow
    again in order and its failure window starts anew (Conflict if it is not quarantined)."""
    cur = await conn.execute(Q["thread_health_release"], {"stream_key": stream_key})
    released = await cur.fetchone()
    if released is None:
        raise Conflict(f"{stream_key} is not quarantined")
    await conn.execute(Q["thread_unquarantine"], {"stream_key": stream_key})
    return {"stream": stream_key, "held": int(released["held"])}
