"""Employees and generations, database side (SPEC §3): apply, start, stop, resume, reset.

Start creates generation g+1 with its frozen snapshot and compiles its subscriptions in the
same transaction; its streams stay held (`starting`) until `activate` says it runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from eventos import names
from eventos.alarms.store import cancel_generation
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict, EndpointNotAllowed, NotFound, SpecInvalid
from eventos.runtime.metrics import DEAD_RESET, count_dead
from eventos.secret_purposes import SecretPurposes
from eventos.spec.model import CHANNEL_KINDS, EmployeeSpec, Trigger, parse_spec
from eventos.spec.secret_uses import purpose_errors

if TYPE_CHECKING:  # eventos.llm imports the ledger, which imports this module
    from eventos.llm.endpoints import LlmEndpoints

# Event types each trigger kind subscribes to ("*" = any type from its source).
EVENT_TYPES = {"chat": [names.TYPE_CHAT_MESSAGE], "webhook": [names.TYPE_WEBHOOK]}
# Default thread: one conversation per counterpart on channels (SPEC §3).
DEFAULT_THREAD_BY = {kind: "subject" for kind in CHANNEL_KINDS}


@dataclass(frozen=True)
class Applied:
    """What apply did."""

    name: str
    created: bool
    changed: bool


@dataclass(frozen=True)
class GenerationRef:
    """One generation and its state."""

    employee: str
    generation: int
    state: str


def spec_digest(spec: EmployeeSpec) -> tuple[dict[str, Any], str]:
    """The spec as stored JSON and its sha256."""
    doc = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    sha = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return doc, sha


def trigger_source_key(employee: str, name: str, t: Trigger) -> str:
    """The source a trigger listens to."""
    if t.kind == "webhook":
        return names.source_key(names.SOURCE_WEBHOOK, str(t.path))
    if t.kind == "chat":
        return names.source_key(names.SOURCE_CHAT, employee)
    if t.kind == "grpc":
        return names.source_key(names.SOURCE_GRPC, str(t.driver))
    if t.kind in CHANNEL_KINDS:
        return names.source_key(t.kind, str(t.account))
    if t.kind == "watch":
        return names.source_key("watch", str(t.store))
    return names.source_key(t.kind, f"{employee}/{name}")


def compile_subscriptions(spec: EmployeeSpec, generation: int) -> list[dict[str, object]]:
    """One subscription row per trigger of a generation's snapshot."""
    front = spec.spec.agents[0].name
    rows: list[dict[str, object]] = []
    for t, name in zip(spec.spec.triggers, spec.trigger_names(), strict=True):
        params = t.model_dump(
            mode="json",
            include={"verify", "max_body", "dedupe_header", "schedule", "interval_s", "text"},
            exclude_none=True,
        )
        if t.token_ref is not None:
            params["token"] = t.token_ref  # a reference, never the token (SPEC §5)
        rows.append(
            {
                "employee": spec.name,
                "generation": generation,
                "trigger_name": name,
                "trigger_kind": t.kind,
                "event_types": t.types or EVENT_TYPES.get(t.kind, ["*"]),
                "source_key": trigger_source_key(spec.name, name, t),
                "filter": Jsonb(t.filter),
                "params": Jsonb(params),
                "class": t.klass,
                "thread_by": t.thread_by or DEFAULT_THREAD_BY.get(t.kind),
                "lane": t.lane,
                "agent": t.agent or front,
                "debounce": Jsonb(t.debounce.model_dump()) if t.debounce else None,
                "on_busy": t.on_busy,
                "reply_capable": t.kind == "chat" or t.kind in CHANNEL_KINDS,
            }
        )
    rows += [implicit_subscription(spec.name, generation, front, kind, klass)
             for kind, klass in IMPLICIT_SOURCES.items()]  # fmt: skip
    return rows


# Implicit subscriptions of every generation (SPEC §3): to its front agent, placed by the event
# itself (alarms into the thread that set them; messages and tasks from other employees into
# `peer_<sender>_<origin>`, one thread per conversation of the sender; task results into the
# origin thread, an owner's Retry of a tool call into the thread that made it).
IMPLICIT_SOURCES = {names.SOURCE_ALARM: names.C4_BACKGROUND, names.SOURCE_IPC: names.C3_INTERNAL,
                    names.SOURCE_TOOL: names.C3_INTERNAL}  # fmt: skip
IMPLICIT_PREFIX = "implicit:"  # no spec trigger name holds a colon


def implicit_subscription(employee: str, generation: int, front: str, kind: str,
                          klass: int) -> dict[str, object]:  # fmt: skip
    """The subscription of source `<kind>:<employee>` (only internal producers write it)."""
    return {
        "employee": employee, "generation": generation, "trigger_name": IMPLICIT_PREFIX + kind,
        "trigger_kind": kind, "event_types": ["*"],
        "source_key": names.source_key(kind, employee), "filter": Jsonb({}),
        "params": Jsonb({}), "class": klass, "thread_by": names.THREAD_BY_EXPLICIT,
        "lane": names.LANE_WORKER, "agent": front, "debounce": None, "on_busy": names.ON_BUSY_MERGE,
        "reply_capable": False,
    }  # fmt: skip


def check_endpoints(spec: EmployeeSpec, endpoints: LlmEndpoints) -> None:
    """SpecInvalid unless every agent's model calls an endpoint the operator allows, with a
    credential that endpoint may get (a spec alone never picks where a key is sent)."""
    errors: list[tuple[str, str]] = []
    for i, agent in enumerate(spec.spec.agents):
        try:
            endpoints.resolve(agent.model)
        except EndpointNotAllowed as exc:
            errors.append((f"spec.agents[{i}].model.{exc.field}", str(exc)))
    if errors:
        raise SpecInvalid(errors)


def check_purposes(spec: EmployeeSpec, declared: SecretPurposes) -> None:
    """SpecInvalid naming each secret reference outside the purpose its operator declared."""
    errors = purpose_errors(spec, declared)
    if errors:
        raise SpecInvalid(errors)


async def apply(conn: Conn, spec: EmployeeSpec, endpoints: LlmEndpoints,
                declared: SecretPurposes) -> Applied:  # fmt: skip
    """Store a spec; refuses a model endpoint off the operator's list, a secret reference
    outside its declared purpose, and a webhook path another employee holds (paths are per
    instance)."""
    check_endpoints(spec, endpoints)
    check_purposes(spec, declared)
    doc, sha = spec_digest(spec)
    paths = spec.webhook_paths()
    async with conn.transaction():
        cur = await conn.execute(Q["employee_get"], {"name": spec.name})
        before = await cur.fetchone()
        cur = await conn.execute(Q["webhook_path_owners"], {"paths": paths})
        for row in await cur.fetchall():
            if row["employee"] != spec.name:
                raise Conflict(
                    f"webhook path {row['path']!r} is already used by {row['employee']!r}"
                )
        cur = await conn.execute(
            Q["employee_upsert"], {"name": spec.name, "spec": Jsonb(doc), "sha": sha}
        )
        created = bool((await cur.fetchone() or {}).get("created"))
        await conn.execute(Q["webhook_paths_clear"], {"employee": spec.name, "paths": paths})
        for path in paths:
            await conn.execute(Q["webhook_path_claim"], {"path": path, "employee": spec.name})
    changed = before is None or before["spec_sha256"] != sha
    # A deleted name comes back as a fresh employee (the upsert revived its row).
    return Applied(spec.name, created or before is None, changed)


async def _lock_employee(conn: Conn, name: str) -> dict[str, Any]:
    cur = await conn.execute(Q["employee_lock"], {"name": name})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no employee named {name!r}")
    return row


async def _live(conn: Conn, name: str) -> GenerationRef | None:
    cur = await conn.execute(Q["generation_live"], {"employee": name})
    row = await cur.fetchone()
    if row is None:
        return None
    return GenerationRef(name, int(row["generation"]), str(row["state"]))


async def live_locked(conn: Conn, name: str) -> GenerationRef | None:
    """The employee's live generation or None, locked with the employee (in a transaction);
    NotFound for an employee never applied or deleted."""
    await _lock_employee(conn, name)
    return await _live(conn, name)


async def known(conn: Conn, name: str) -> None:
    """NotFound unless the employee was ever applied (a deleted one's history stays readable)."""
    cur = await conn.execute(Q["employee_known"], {"name": name})
    if await cur.fetchone() is None:
        raise NotFound(f"no employee named {name!r}")


async def lock_live(conn: Conn, name: str) -> GenerationRef:
    """The employee's live generation, locked with the employee (inside a transaction)."""
    live = await live_locked(conn, name)
    if live is None:
        raise Conflict(f"{name!r} has no live generation")
    return live


async def start(conn: Conn, name: str) -> GenerationRef:
    """Create generation g+1 (`starting`), its snapshot and subscriptions in one transaction."""
    async with conn.transaction():
        emp = await _lock_employee(conn, name)
        live = await _live(conn, name)
        if live is not None:
            raise Conflict(f"{name!r} already has generation {live.generation} ({live.state})")
        spec = parse_spec(emp["spec"], stored=True)
        cur = await conn.execute(Q["generation_next_number"], {"employee": name})
        number = int((await cur.fetchone() or {})["generation"])
        params = {"employee": name, "generation": number, "spec": Jsonb(emp["spec"])}
        await conn.execute(Q["generation_create"], {**params, "sha": emp["spec_sha256"]})
        rows = compile_subscriptions(spec, number)
        if rows:
            async with conn.cursor() as cur2:
                await cur2.executemany(Q["subscription_insert"], rows)
    return GenerationRef(name, number, names.GEN_STARTING)


async def _transition(
    conn: Conn, name: str, *, allowed: tuple[str, ...], to: str, pause_reason: str | None = None
) -> GenerationRef:
    live = await lock_live(conn, name)
    if live.state not in allowed:
        raise Conflict(f"{name!r} generation {live.generation} is {live.state}, not {allowed}")
    await conn.execute(
        Q["generation_set_state"],
        {
            "employee": name,
            "generation": live.generation,
            "state": to,
            "pause_reason": pause_reason,
        },
    )
    return GenerationRef(name, live.generation, to)


async def activate(conn: Conn, name: str) -> GenerationRef:
    """The starting generation runs: its `starting` holds are released."""
    async with conn.transaction():
        ref = await _transition(conn, name, allowed=(names.GEN_STARTING,), to=names.GEN_RUNNING)
        await _set_holds(conn, ref, release=names.HOLD_STARTING)
    return ref


async def activate_generation(conn: Conn, name: str, generation: int) -> bool:
    """Activate generation `generation` if it is still `starting` (its supervisor's first run);
    false when it already runs, was paused meanwhile, or is not the live one."""
    async with conn.transaction():
        await _lock_employee(conn, name)
        live = await _live(conn, name)
        if live is None or live.generation != generation or live.state != names.GEN_STARTING:
            return False
        await activate(conn, name)
    return True


async def stop(conn: Conn, name: str, pause_reason: str = names.PAUSE_OWNER) -> GenerationRef:
    """Pause the live generation: its streams are held `paused`."""
    async with conn.transaction():
        allowed = (names.GEN_STARTING, names.GEN_RUNNING)
        ref = await _transition(
            conn, name, allowed=allowed, to=names.GEN_PAUSED, pause_reason=pause_reason
        )
        await _set_holds(conn, ref, hold=names.HOLD_PAUSED)
    return ref


async def resume(conn: Conn, name: str) -> GenerationRef:
    """Resume a paused generation: `paused` holds are released."""
    async with conn.transaction():
        ref = await _transition(conn, name, allowed=(names.GEN_PAUSED,), to=names.GEN_RUNNING)
        await _set_holds(conn, ref, release=names.HOLD_PAUSED)
        await _set_holds(conn, ref, release=names.HOLD_STARTING)
    return ref


async def reset(conn: Conn, name: str) -> GenerationRef:
    """Retire the live generation: every delivery no turn consumed (pending, held, or already
    signalled to a conversation the Reset cancels) becomes dead(reset) in this transaction, so
    none stays open for ever, and so do the owner's messages among them; its alarms and its
    open delegations are cancelled."""
    async with conn.transaction():
        allowed = (names.GEN_STARTING, names.GEN_RUNNING, names.GEN_PAUSED)
        ref = await _transition(conn, name, allowed=allowed, to=names.GEN_RETIRED)
        params = {"employee": name, "generation": ref.generation}
        cur = await conn.execute(Q["deliveries_kill_generation"], params)
        killed = [int(r["ingress_id"]) for r in await cur.fetchall()]
        await conn.execute(Q["chat_messages_kill_generation"], {"employee": name,
                                                                "ingress_ids": killed})  # fmt: skip
        await conn.execute(Q["streams_clear_pending"], params)
        await cancel_generation(conn, name, ref.generation)  # its alarms never fire
        await conn.execute(Q["ipc_tasks_cancel_generation"], params)  # nor its task deadlines
    count_dead(DEAD_RESET, len(killed))
    return ref


async def _set_holds(
    conn: Conn, ref: GenerationRef, *, hold: str | None = None, release: str | None = None
) -> None:
    params = {"employee": ref.employee, "generation": ref.generation}
    if hold is not None:
        await conn.execute(Q["streams_hold"], {**params, "reason": hold})
    if release is not None:
        await conn.execute(Q["streams_release"], {**params, "reason": release})


async def get(conn: Conn, name: str) -> dict[str, Any]:
    """One employee and its live generation."""
    cur = await conn.execute(Q["employee_get"], {"name": name})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no employee named {name!r}")
    return row


async def list_all(conn: Conn) -> list[dict[str, Any]]:
    """Every employee and its live generation."""
    cur = await conn.execute(Q["employee_list"])
    return await cur.fetchall()
