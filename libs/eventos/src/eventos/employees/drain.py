"""A flag change drains the live generation into a new one (SPEC §3, EG2), database side.

Flags are frozen in a generation, so applying a spec whose flags differ from the live
generation's cannot change it: `apply` stores the spec and, in the same transaction, Stops the
live generation with `pause_reason=drain` (its intent stops its running turns at their next
merge point; admission refuses new ones; its streams are held). When that Stop is delivered
and no turn of the old generation runs any more (the database says so, I1), `complete` does the
rest in one transaction: the old generation retires without killing anything, a new one starts
from the stored spec, every input no turn consumed moves to the new generation's stream of the
same conversation (pending, in order, the same row: consumed once), the conversation store and
the scheduled alarms carry over, the Reset and Start intents follow for Temporal, and the owner
gets an attention item. A generation the owner or the budget had paused is drained the same way
and its successor paused again for the same reason.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.employees import intents, lifecycle
from eventos.employees.lifecycle import GenerationRef
from eventos.secret_purposes import SecretPurposes
from eventos.spec.model import EmployeeSpec, resolve_flags

if TYPE_CHECKING:  # eventos.llm imports the ledger, which imports lifecycle
    from eventos.llm.endpoints import LlmEndpoints


class NotYet(Exception):
    """The drained generation still has turns running; they stop at their next merge point."""


@dataclass(frozen=True)
class Drained:
    """What `complete` did: the generations and what was carried over."""

    employee: str
    old: int
    new: int
    inputs: int
    conversations: int

    def outcome(self) -> str:
        return (f"generation {self.old} drained into generation {self.new}: {self.inputs} "
                f"input(s) and {self.conversations} conversation(s) carried over")  # fmt: skip


async def _frozen(conn: Conn, ref: GenerationRef) -> dict[str, Any]:
    cur = await conn.execute(Q["drain_generation_flags"],
                             {"employee": ref.employee, "generation": ref.generation})  # fmt: skip
    row = await cur.fetchone()
    assert row is not None
    return row


def changed_flags(before: dict[str, bool], after: dict[str, bool]) -> str:
    """`name: old → new` for each flag that differs."""
    return ", ".join(f"{k}: {str(before[k]).lower()} → {str(after[k]).lower()}"
                     for k in after if before.get(k) != after[k])  # fmt: skip


async def apply(conn: Conn, spec: EmployeeSpec, endpoints: LlmEndpoints,
                declared: SecretPurposes) -> tuple[lifecycle.Applied, int | None]:  # fmt: skip
    """Store the spec (lifecycle.apply) and, when its flags differ from the live generation's,
    begin the drain in the same transaction: (what apply did, the draining generation)."""
    async with conn.transaction():
        applied = await lifecycle.apply(conn, spec, endpoints, declared)
        live = await lifecycle.live_locked(conn, spec.name)
        if live is None or not applied.changed:
            return applied, None
        frozen = await _frozen(conn, live)
        if resolve_flags(frozen["flags"]) == spec.spec.resolved_flags():
            return applied, None
        if live.state != names.GEN_PAUSED:  # a paused one waits as it is
            stop = functools.partial(lifecycle.stop, pause_reason=names.PAUSE_DRAIN)
            await intents.request(conn, spec.name, names.INTENT_STOP, stop)
            return applied, live.generation
        # Paused already (owner, budget, or an earlier drain): its successor keeps the reason.
        if not draining(frozen["pause_reason"]):
            params = {"employee": spec.name, "generation": live.generation, "state": live.state,
                      "pause_reason": f"{names.PAUSE_DRAIN}:{frozen['pause_reason']}"}  # fmt: skip
            await conn.execute(Q["generation_set_state"], params)
            await intents.request(conn, spec.name, names.INTENT_STOP, _paused_as_is)
    return applied, live.generation


async def _paused_as_is(conn: Conn, name: str) -> GenerationRef:
    return await lifecycle.lock_live(conn, name)


def draining(pause_reason: str | None) -> bool:
    """Whether a generation paused with this reason is being drained."""
    return (pause_reason or "").split(":", 1)[0] == names.PAUSE_DRAIN


async def complete(conn: Conn, employee: str, generation: int) -> Drained | None:
    """Drain `generation` into a new one (one transaction); None when there is nothing to do
    (it was reset, resumed or drained meanwhile); NotYet while its turns still run."""
    async with conn.transaction():
        live = await lifecycle.live_locked(conn, employee)
        if live is None or live.generation != generation or live.state != names.GEN_PAUSED:
            return None
        frozen = await _frozen(conn, live)
        if not draining(frozen["pause_reason"]):
            return None
        params = {"employee": employee, "generation": generation}
        cur = await conn.execute(Q["generation_running_turns"], params)
        running = await cur.fetchall()
        if running:
            raise NotYet(f"waiting for {len(running)} turn(s) of generation {generation} to "
                         f"stop at their next merge point")  # fmt: skip
        return await _drain(conn, live, frozen)


async def _drain(conn: Conn, old: GenerationRef, frozen: dict[str, Any]) -> Drained:
    employee = old.employee
    retired = GenerationRef(employee, old.generation, names.GEN_RETIRED)
    await conn.execute(Q["generation_set_state"], {"employee": employee,
                                                   "generation": old.generation,
                                                   "state": names.GEN_RETIRED,
                                                   "pause_reason": None})  # fmt: skip
    new = await lifecycle.start(conn, employee)
    moved = await _move_streams(conn, employee, old.generation, new.generation)
    params = {"employee": employee, "from": old.generation, "to": new.generation}
    cur = await conn.execute(Q["drain_conversations_copy"], params)
    conversations = cur.rowcount
    await conn.execute(Q["drain_transcripts_copy"], params)
    await conn.execute(Q["drain_alarms_move"], params)
    await conn.execute(Q["streams_clear_pending"], {"employee": employee,
                                                    "generation": old.generation})  # fmt: skip
    # Temporal follows from the intents, in order: the old supervisor retires (its entities are
    # cancelled with nothing left to run), the new one starts (and is paused again if need be).
    await intents.request(conn, employee, names.INTENT_RESET, _returns(retired))
    await intents.request(conn, employee, names.INTENT_START, _returns(new))
    _, _, paused_by = str(frozen["pause_reason"]).partition(":")
    if paused_by:
        stop = functools.partial(lifecycle.stop, pause_reason=paused_by)
        await intents.request(conn, employee, names.INTENT_STOP, stop)
    drained = Drained(employee, old.generation, new.generation, moved, conversations)
    await _notice(conn, drained, frozen)
    return drained


def _returns(ref: GenerationRef) -> intents.Transition:
    async def done(conn: Conn, name: str) -> GenerationRef:
        return ref

    return done


async def _move_streams(conn: Conn, employee: str, old: int, new: int) -> int:
    """Create each old stream again in the new generation and move its unconsumed inputs."""
    cur = await conn.execute(Q["drain_streams_of"], {"employee": employee, "generation": old})
    moved = 0
    for s in await cur.fetchall():
        key = names.stream_key(employee, new, s["lane"], s["thread"])
        await conn.execute(Q["drain_stream_create"], {
            "stream_key": key, "employee": employee, "generation": new, "lane": s["lane"],
            "thread": s["thread"],
            "entity_id": names.entity_id(employee, new, s["lane"], s["thread"]),
        })  # fmt: skip
        cur2 = await conn.execute(Q["drain_deliveries_move"], {
            "to_key": key, "from_key": s["stream_key"], "generation": new})  # fmt: skip
        n = len(await cur2.fetchall())
        await conn.execute(Q["drain_stream_settle"], {"stream_key": key, "moved": n})
        moved += n
    return moved


async def _notice(conn: Conn, drained: Drained, frozen: dict[str, Any]) -> None:
    """The owner's notice: an attention item on the new generation (info)."""
    cur = await conn.execute(Q["drain_generation_flags"],
                             {"employee": drained.employee, "generation": drained.new})  # fmt: skip
    now = await cur.fetchone()
    assert now is not None
    flags = changed_flags(resolve_flags(frozen["flags"]), resolve_flags(now["flags"]))
    await conn.execute(Q["attention_raise"], {
        "employee": drained.employee, "kind": names.ATTENTION_GENERATION_DRAINED,
        "severity": "info", "ref": names.supervisor_id(drained.employee, drained.new),
        "detail": f"flags changed ({flags}): {drained.outcome()}"[:1000],
    })  # fmt: skip
