"""Admission, database side (SPEC §9): `acquire` and `release` of turn slots, one
transaction each, serialized instance-wide (capacity is shared).

An entity that asks joins the waiters (or keeps its place), then free slots are offered by
`policy.offers`, given only the waiters it could reach (read by index: `_candidates`); if one
is offered to the asker it is granted at once, otherwise the entity waits for `wake`. A
release offers the freed slot the same way and names the entities to wake; an offered
entity's next ask is granted. An offer not taken within `OFFER_TTL_S` lapses, and a waiter
that stopped asking is forgotten (entities ask again every `names.ADMISSION_ASK_AGAIN_S`
while they wait, since a Signal is only a hint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncCursor

from eventos import failures, names
from eventos.contracts import Admission, AdmitRequest, SuspendTurn
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.health import intensity
from eventos.runtime.metrics import (
    ADMISSION_WAIT,
    PARKED_TURNS,
    TURN_DURATION,
    TURN_FAILURES,
    class_label,
)
from eventos.scheduling import policy
from eventos.scheduling.policy import Load, SchedConfig, Waiter

OFFER_TTL_S = 60.0
STALE_WAITER_S = 3 * names.ADMISSION_ASK_AGAIN_S
BUDGET_HELD_CLASSES = (names.C3_INTERNAL, names.C4_BACKGROUND)  # held while the budget is high


@dataclass(frozen=True)
class Answer:
    """Admission's answer and the entities to wake (slots were offered to them)."""

    admission: Admission
    wake: list[str]


def turn_id(req: AdmitRequest, n: int) -> str:
    """`turn-<conversation>-<n>` (SPEC §7); thread ids carry no personal data."""
    return f"turn-{req.employee}-g{req.generation}-{req.agent}-{req.thread}-{n}"


async def acquire(conn: Conn, req: AdmitRequest, cfg: SchedConfig) -> Answer:
    """Grant a slot and (for a new turn) a turn number, or queue the entity.

    The instance-wide lock is held for a few round trips (statements are pipelined, and read
    back only where a decision needs them); the gates, which admission does not write, are
    read before it."""
    async with conn.transaction(), conn.pipeline():
        gated = await conn.execute(Q["admission_gate"], {"employee": req.employee,
                                                         "generation": req.generation,
                                                         "stream_key": req.stream_key})  # fmt: skip
        await conn.execute(Q["sched_lock"])
        asked = reserved = None
        if req.ask and not req.turn_id:
            asked = await conn.execute(Q["turn_granted_to_ask"], {"ask": req.ask})
        if owners(req):
            reserved = await conn.execute(Q["reserved_held"], {"employee": req.employee})
        row = await gated.fetchone() or {}  # one round trip for the four
        granted = await _granted_before(asked)
        if granted is not None:
            return Answer(granted, [])
        refusal = gate(req, row.get("generation_state"), row.get("budget_state"))
        if refusal is None and req.turn_id:
            refusal = await _parked_too_long(conn, req.turn_id)
        elif refusal is None:  # a new turn of a failing thread, or a degraded employee's C3/C4
            refusal = intensity.admission_refusal(req, row)
        if refusal is not None:
            await conn.execute(Q["waiter_delete"], {"stream_key": req.stream_key})
            _, wake = await _serve(conn, cfg)
            return Answer(refusal, wake)
        if reserved is not None and not (await reserved.fetchone() or {}).get("held"):
            # It may have queued while its reserved slot was taken.
            deleted = await conn.execute(Q["waiter_delete"], {"stream_key": req.stream_key})
            return Answer(await _grant(conn, req, True, deleted), [])
        upserted = await conn.execute(Q["waiter_upsert"], {
            "stream_key": req.stream_key, "employee": req.employee, "generation": req.generation,
            "agent": req.agent, "thread": req.thread, "class": req.klass,
            "workflow_id": req.workflow_id, "turn_id": req.turn_id or None,
            "takes_held": req.holds, "offer_ttl_s": OFFER_TTL_S,
        })  # fmt: skip
        offered, wake = await _serve(conn, cfg, asker=req.stream_key)
        kept = bool((await upserted.fetchone() or {}).get("offered"))  # offered before this ask
        if not (kept or offered):
            return Answer(Admission(granted=False, reason="waiting for a slot"), wake)
        deleted = await conn.execute(Q["waiter_delete"], {"stream_key": req.stream_key})
        return Answer(await _grant(conn, req, False, deleted), wake)


async def _granted_before(asked: AsyncCursor[dict[str, Any]] | None) -> Admission | None:
    """The turn this very ask was granted (`turn_granted_to_ask`), when its answer never
    reached the entity (a retried workflow task, a dropped connection) and the turn still
    holds its slot."""
    row = None if asked is None else await asked.fetchone()
    if row is None:
        return None
    return Admission(granted=True, turn_id=row["id"], n=row["n"], reserved=row["reserved"])


def _waited(row: dict[str, Any] | None) -> float:
    return float(row["waited_s"]) if row else 0.0


async def _parked_too_long(conn: Conn, tid: str) -> Admission | None:
    """A parked turn asking again after 7 days parked (by the database's clock) ends: its
    inputs are dead-lettered."""
    cur = await conn.execute(Q["turn_parked_for"], {"turn_id": tid})
    row = await cur.fetchone()
    if row is None or row["parked_s"] is None or row["parked_s"] <= names.PARK_MAX_S:
        return None
    return Admission(granted=False, reason="parked for 7 days", gate=names.GATE_PARKED_TOO_LONG)


def owners(req: AdmitRequest) -> bool:
    """The owner's own conversation (owner chat, class C1): the reserved slot is for it only,
    not for other work an operator put in C1, nor for a user granted C1 (a guest, SPEC §17)."""
    return (
        req.klass == names.C1_OWNER
        and names.lane_of(req.stream_key) == names.LANE_TALK
        and not req.thread.startswith(names.USER_THREAD_PREFIX)
    )


def gate(req: AdmitRequest, generation_state: str | None, budget_state: str | None
         ) -> Admission | None:  # fmt: skip
    """The generation, pause and budget gate: a refusal, or None to go on."""
    if generation_state != names.GEN_RUNNING:
        retired = generation_state in (None, names.GEN_RETIRED)
        return Admission(granted=False, reason=f"generation {req.generation} is {generation_state}",
                         gate=names.GEN_RETIRED if retired else names.GEN_PAUSED)  # fmt: skip
    # At `high` background work waits; at `max` everything does (even after a plain Resume:
    # only the period's end or a top-up lowers it), so a turn never starts just to suspend.
    held = budget_state == names.BUDGET_MAX or (
        budget_state == names.BUDGET_HIGH and req.klass in BUDGET_HELD_CLASSES
    )
    if held:
        return Admission(granted=False, reason=f"budget is {budget_state}",
                         gate=names.GATE_BUDGET)  # fmt: skip
    return None


async def _grant(conn: Conn, req: AdmitRequest, reserved: bool,
                 deleted: AsyncCursor[dict[str, Any]]) -> Admission:  # fmt: skip
    """The slot, once the asker's waiter is `deleted` (`waiter_delete`: how long it waited)."""
    params: dict[str, Any] = {
        "employee": req.employee, "generation": req.generation, "agent": req.agent,
        "thread": req.thread, "stream_key": req.stream_key, "class": req.klass,
        "reserved": reserved,
    }  # fmt: skip
    await conn.execute(Q["round_served"], params)
    if req.turn_id:  # a suspended turn takes its slot again under the same id
        await conn.execute(Q["lease_resume"], {**params, "id": req.turn_id})
        await conn.execute(Q["attention_resolve"], {"kind": names.ATTENTION_PARKED_TURN,
                                                    "ref": req.turn_id})  # fmt: skip
        _observe_wait(req, _waited(await deleted.fetchone()))
        return Admission(granted=True, turn_id=req.turn_id, reserved=reserved)
    cur = await conn.execute(Q["conversation_open"], params)
    params["waited_s"] = _observe_wait(req, _waited(await deleted.fetchone()))
    n = int((await cur.fetchone() or {})["n"])
    tid = turn_id(req, n)
    await conn.execute(Q["turn_insert"], {**params, "id": tid, "n": n, "ask": req.ask or None})
    await conn.execute(Q["lease_grant"], {**params, "id": tid})
    return Admission(granted=True, turn_id=tid, n=n, reserved=reserved)


def _observe_wait(req: AdmitRequest, waited_s: float) -> float:
    ADMISSION_WAIT.labels(f"c{req.klass}").observe(waited_s)
    return waited_s


async def _serve(conn: Conn, cfg: SchedConfig, asker: str | None = None) -> tuple[bool, list[str]]:
    """Offer free slots to waiters: (whether the asker was offered one now, the other offered
    entities' workflow ids, to wake)."""
    await conn.execute(Q["waiters_expire"], {"offer_ttl_s": OFFER_TTL_S,
                                             "stale_s": STALE_WAITER_S})  # fmt: skip
    load = await _load(conn, cfg)
    rows = await _candidates(conn, cfg, load)
    chosen = [w.stream_key for w in policy.offers(cfg, load, [_waiter(r) for r in rows])]
    if chosen:
        await conn.execute(Q["waiters_offer"], {"stream_keys": chosen})
    workflow_of = {r["stream_key"]: r["workflow_id"] for r in rows}
    return asker in chosen, [workflow_of[s] for s in chosen if s != asker]


async def _candidates(conn: Conn, cfg: SchedConfig, load: Load) -> list[dict[str, Any]]:
    """The waiters a pass may offer the free slots to, read by index whatever the number of
    waiters: in each class below its ceiling, the first `free` employees in turn below their
    cap, each with its first min(`free`, cap) waiters. `policy.offers` picks from these as it
    would from every waiter: a pass makes at most `free` offers; in a class it serves the
    employees in turn and then those it served again (oldest waiter first), and it moves past
    an employee only once that employee got an offer in the pass (or got one elsewhere and
    reached its cap), so the class's (free+1)-th employee in turn is never reached, and no
    employee gets more than min(free, cap) offers."""
    free = cfg.capacity - load.held()
    classes = [k for k, most in cfg.class_max.items() if load.by_class.get(k, 0) < most]
    if free <= 0 or not classes:
        return []  # a full instance: nothing to read
    capped = [e for e, n in load.by_employee.items() if n >= cfg.employee_cap]
    cur = await conn.execute(Q["waiters_next"], {
        "classes": classes, "capped": capped, "slots": free,
        "each": min(free, cfg.employee_cap),
    })  # fmt: skip
    return await cur.fetchall()


def _waiter(r: dict[str, Any]) -> Waiter:
    return Waiter(r["stream_key"], r["employee"], int(r["class"]), r["requested_at"],
                  r["served_at"])  # fmt: skip


async def _load(conn: Conn, cfg: SchedConfig) -> Load:
    held = await conn.execute(Q["sched_load"])
    cur = await conn.execute(Q["sched_admitted"], {"window_s": cfg.share_window_s})
    by_class: dict[int, int] = {}
    by_employee: dict[str, int] = {}
    for r in await held.fetchall():
        by_class[int(r["class"])] = by_class.get(int(r["class"]), 0) + int(r["n"])
        by_employee[r["employee"]] = by_employee.get(r["employee"], 0) + int(r["n"])
    admitted = {int(r["class"]): int(r["n"]) for r in await cur.fetchall()}
    return Load(by_class, by_employee, admitted)


async def release(conn: Conn, cfg: SchedConfig, tid: str, status: str,
                  error: str | None = None) -> tuple[bool, list[str]]:  # fmt: skip
    """Give the slot back (a turn that did not save ends `failed` or `cancelled`) and offer
    it: (whether anything changed — a repeated release changes nothing, the entities to wake)."""
    async with conn.transaction(), conn.pipeline() as pipeline:
        await conn.execute(Q["sched_lock"])
        freed = await conn.execute(Q["slot_release"], {"turn_id": tid})
        ended = await conn.execute(
            Q["turn_finish"], {"turn_id": tid, "status": status, "error": error}
        )
        timed = await conn.execute(Q["turn_timing"], {"turn_id": tid})
        await pipeline.sync()
        _, wake = await _serve(conn, cfg) if freed.rowcount else (False, [])
        timing = await timed.fetchone()
    changed = freed.rowcount + ended.rowcount > 0
    if changed and timing is not None:  # once per turn: a repeated release changes nothing
        labels = (class_label(int(timing["class"])), str(timing["status"]))
        TURN_DURATION.labels(*labels).observe(max(float(timing["duration_s"]), 0.0))
        if status == names.TURN_FAILED:
            TURN_FAILURES.labels(failures.category_in(error)).inc()
    return changed, wake


async def suspend(conn: Conn, cfg: SchedConfig, req: SuspendTurn) -> list[str]:
    """The turn holds no slot until it is granted one again under the same id (a suspended
    lease counts toward nothing); the freed slot is offered. A parked turn raises an attention
    item with its reason. The entities to wake."""
    async with conn.transaction():
        await conn.execute(Q["sched_lock"])
        cur = await conn.execute(Q["lease_suspend"], {"turn_id": req.turn_id,
                                                      "reason": req.reason})  # fmt: skip
        if await cur.fetchone() is None:
            return []  # already suspended (a retried activity)
        if req.reason.startswith(names.PARKED):
            await conn.execute(Q["turn_parked"], {"turn_id": req.turn_id})
            await conn.execute(Q["timeline_turn_parked"], {"turn_id": req.turn_id,
                                                           "error": req.detail[:500]})  # fmt: skip
            PARKED_TURNS.labels(req.reason.split(":", 1)[-1].strip()).inc()
            cause = f" ({req.detail})" if req.detail else ""  # eventos.failures: bounded
            await conn.execute(Q["attention_raise"], {
                "employee": req.employee, "kind": names.ATTENTION_PARKED_TURN,
                "severity": "warning", "ref": req.turn_id,
                "detail": (f"{req.reason}{cause}: the turn waits (no slot held), probing every "
                           "15 minutes; Resume, a top-up or a fixed key release it")[:1000],
            })  # fmt: skip
        _, wake = await _serve(conn, cfg)
    return wake


async def upgrade(conn: Conn, tid: str, klass: int) -> None:
    """Priority inheritance: the lease counts in `klass` from now on (only ever upward)."""
    async with conn.transaction():
        await conn.execute(Q["sched_lock"])
        await conn.execute(Q["lease_upgrade"], {"turn_id": tid, "class": klass})
