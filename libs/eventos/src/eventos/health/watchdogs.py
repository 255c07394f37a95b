"""The supervision watchdogs (SPEC §12) beside the turn watchdog (`eventos.health.turn_watchdog`).

Each reads a condition from the database at `now`, raises one attention item per thing it
finds (refreshed while the condition lasts, not counted again) and resolves the items whose
condition cleared:
- `router_stalled` (instance-wide, employee `(instance)`): the oldest `accepted` ingress row is
  older than `router_stalled_s` (30 s).
- `window_stalled` (ref: the stream): the relay holds the stream `window` (32 inputs or 512 KB
  sent to the entity and not consumed) while no turn runs on it and its entity asks for no slot,
  with no turn ended and nothing sent to it for `window_idle_s` (5 minutes): a credit leak.
  A paused generation, a budget past normal or a degraded employee hold inputs there on purpose
  and are not reported.
- `stuck_retry`: an intent still `applying` after `stuck_intent_attempts` (8, about 4 minutes of
  1, 2, 4 … 60 s retries; ref `intent:<id>`), or an outbox row still queued or sending after
  `stuck_send_attempts` (5) claims (the provider kept deferring or failing it; ref
  `outbox#<id>`).
- `stuck_turn` (ref: the turn): a turn holding a slot with no step progress (no completed LLM
  step, no slot regained) for `stuck_turn_s` (10 minutes): a step or a tool call hangs, or its
  workflow task keeps failing. Suspended and parked turns hold no slot and are not reported;
  the item resolves once the turn steps again or ends.
- `workflow_task_failing` (ref: the workflow id): reported by the relay's upkeep sweep
  (`eventos.health.upkeep`), which lists the workflows Temporal flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.runtime.metrics import WATCHDOG_ALERTS
from eventos.settings import SupervisionSettings

ITEMS_READ: Final = 500  # things each watchdog reports per pass
ROUTER_REF: Final = "router"


@dataclass(frozen=True)
class Alert:
    """One thing a watchdog found."""

    employee: str
    ref: str
    detail: str
    severity: str = "warning"


@dataclass
class Watched:
    """The refs each watchdog reports now, and those it raised in this pass."""

    open: dict[str, list[str]] = field(default_factory=dict)
    raised: list[str] = field(default_factory=list)


async def router_stalled(conn: Conn, cfg: SupervisionSettings, now: datetime) -> list[Alert]:
    cur = await conn.execute(Q["router_oldest_accepted"])
    row = await cur.fetchone()
    oldest = row["oldest"] if row else None
    if oldest is None or (now - oldest).total_seconds() <= cfg.router_stalled_s:
        return []
    age = int((now - oldest).total_seconds())
    detail = (f"the oldest accepted ingress row waits for the router for {age} s "
              f"(more than {cfg.router_stalled_s:g} s): is the router running?")  # fmt: skip
    return [Alert(names.INSTANCE_ITEMS, ROUTER_REF, detail, "error")]


async def window_stalled(conn: Conn, cfg: SupervisionSettings, now: datetime) -> list[Alert]:
    idle_before = now - timedelta(seconds=cfg.window_idle_s)
    cur = await conn.execute(Q["streams_window_idle"],
                             {"idle_before": idle_before, "limit": ITEMS_READ})  # fmt: skip
    minutes = int(cfg.window_idle_s // 60)
    return [
        Alert(r["employee"], r["stream_key"],
              f"the window is full ({r['unconsumed']} inputs sent to the entity, not consumed) "
              f"while no turn runs on it, for more than {minutes} minutes: a credit leak "
              "(when its entity is gone, `eventosctl rearm` gives the inputs back to the relay)")
        for r in await cur.fetchall()
    ]  # fmt: skip


async def stuck_retries(conn: Conn, cfg: SupervisionSettings, now: datetime) -> list[Alert]:
    params = {"attempts": cfg.stuck_intent_attempts, "limit": ITEMS_READ,
              "instance": names.INSTANCE_ITEMS}  # fmt: skip
    intents = await (await conn.execute(Q["intents_retrying"], params)).fetchall()
    params = {"attempts": cfg.stuck_send_attempts, "limit": ITEMS_READ}
    sends = await (await conn.execute(Q["sends_retrying"], params)).fetchall()
    found = [
        Alert(r["employee"], f"intent:{r['id']}",
              f"intent {r['id']} ({r['kind']}) is still not applied after {r['attempts']} "
              f"attempts; last: {r['outcome'] or 'no outcome'}"[:1000])
        for r in intents
    ]  # fmt: skip
    found += [
        Alert(r["employee"], f"outbox#{r['id']}",
              f"outbox row {r['id']} ({r['kind']}) is still {r['status']} after "
              f"{r['attempts']} attempts: the provider keeps deferring or failing it")
        for r in sends
    ]  # fmt: skip
    return found


async def stuck_turns(conn: Conn, cfg: SupervisionSettings, now: datetime) -> list[Alert]:
    quiet_before = now - timedelta(seconds=cfg.stuck_turn_s)
    cur = await conn.execute(Q["turns_stuck"], {"now": now, "quiet_before": quiet_before,
                                                "limit": ITEMS_READ})  # fmt: skip
    return [
        Alert(r["employee"], r["id"],
              f"C{r['class']} turn {r['id']} holds its slot with no step progress for "
              f"{int(r['quiet_s'] // 60)} minutes (more than {cfg.stuck_turn_s:g} s): a step or "
              "a tool call hangs, or its workflow task keeps failing (its timeline shows the last "
              "step; a day without one cancels it)")
        for r in await cur.fetchall()
    ]  # fmt: skip


@dataclass(frozen=True)
class FlaggedWorkflow:
    """A running workflow Temporal flags: its workflow task keeps failing (the upkeep sweep)."""

    id: str
    type: str
    queue: str
    cause: str  # Temporal's cause of the last failure (an enum name, never a message)


async def failing_workflow_tasks(conn: Conn, flagged: list[FlaggedWorkflow]) -> Watched:
    """A `workflow_task_failing` item per flagged workflow, of the employee the database knows
    its id by (else the instance's); the items of workflows no longer flagged resolve."""
    cur = await conn.execute(Q["workflow_employees"], {"ids": [f.id for f in flagged]})
    owners = {str(r["id"]): r["employee"] for r in await cur.fetchall()}
    alerts = [
        Alert(owners.get(f.id) or names.INSTANCE_ITEMS, f.id,
              f"{f.type} {f.id} (queue {f.queue}): its workflow task keeps failing"
              f"{f' ({f.cause})' if f.cause else ''}, so the workflow makes no progress; the "
              "workers-workflow log names the exception (a bug, or a change that is not "
              "deterministic)", "error")
        for f in flagged
    ]  # fmt: skip
    done = Watched()
    await report(conn, done, names.ATTENTION_WORKFLOW_TASK_FAILING, alerts)
    return done


async def watch(conn: Conn, cfg: SupervisionSettings, now: datetime) -> Watched:
    """Every watchdog once: raise what each finds, resolve what each no longer finds."""
    done = Watched()
    found = await router_stalled(conn, cfg, now)
    await report(conn, done, names.ATTENTION_ROUTER_STALLED, found)
    found = await window_stalled(conn, cfg, now)
    await report(conn, done, names.ATTENTION_WINDOW_STALLED, found)
    found = await stuck_retries(conn, cfg, now)
    await report(conn, done, names.ATTENTION_STUCK_RETRY, found)
    found = await stuck_turns(conn, cfg, now)
    await report(conn, done, names.ATTENTION_STUCK_TURN, found)
    return done


async def report(conn: Conn, done: Watched, kind: str, alerts: list[Alert]) -> None:
    """Raise (or refresh) an item per alert of this kind; resolve the kind's others."""
    async with conn.transaction():
        for a in alerts:
            cur = await conn.execute(Q["health_item_raise"], {
                "employee": a.employee, "kind": kind, "severity": a.severity, "ref": a.ref,
                "detail": a.detail,
            })  # fmt: skip
            if (await cur.fetchone() or {}).get("raised"):
                done.raised.append(f"{kind}:{a.ref}")
                WATCHDOG_ALERTS.labels(kind).inc()
        refs = [a.ref for a in alerts]
        await conn.execute(Q["health_items_resolve"], {"kind": kind, "refs": refs})
    done.open[kind] = refs
