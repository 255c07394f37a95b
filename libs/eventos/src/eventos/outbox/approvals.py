"""Approvals (SPEC §11), database side: a held send's approval row, the owner's decision, the
workflow's reads, and the watchdog that makes sure every decision is acted on once.

A send that needs approval, or that a content rule matches, enters the outbox `held` (reason:
the rule ids, or `approval`; never what matched) with an approval row, in the turn's consuming
save: the owner releases it or declines it. Rules only add holds. The owner's decision is
written to the row first (with its place in the decision order), with an intent that nudges
the ApprovalWorkflow. Whoever acts on a decision takes it by compare-and-swap (`taken_at`): the
turn that waits for it, or — when that turn is gone (stopped, lost) — the watchdog, which hands
an approved send to the egress once the generation runs again. The egress sends approved rows
in decision order.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from eventos import names
from eventos.contracts import ApprovalView, HoldToolCall
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict, NotFound
from eventos.owner.users import OWNER
from eventos.runtime.temporal import TemporalConnection
from eventos.spec.content_rules import Rules, compile_rules
from eventos.spec.model import ContentRule

log = logging.getLogger(__name__)
WATCH_LIMIT = 100
WATCH_EVERY_S = 5.0


def approval_id(employee: str, outbound_id: int) -> str:
    """`ap-<employee>-<outbox id>`: unique in the instance and across instances' namespaces."""
    return f"ap-{employee}-{outbound_id}"


def workflow_id(approval: str) -> str:
    return f"approval-{approval}"


def tool_approval_id(employee: str, turn_id: str, call_id: str) -> str:
    """`ap-<employee>-t<digest>` of the call (its id is the model's, of any length)."""
    digest = hashlib.sha256(f"{turn_id}:{call_id}".encode()).hexdigest()[:16]
    return f"ap-{employee}-t{digest}"


async def hold_tool(conn: Conn, req: HoldToolCall) -> str:
    """The approval a tool call waits on; a retried activity finds the first one. It is the
    admin's unless `approvals.decided_by: user` hands it to the user whose chat made the call."""
    ident = tool_approval_id(req.employee, req.turn_id, req.call_id)
    pol = await policy(conn, req.employee, req.generation)
    audience = req.route.get("audience") if req.route.get("kind") == names.KIND_CHAT else None
    user = None if audience in (None, OWNER) else str(audience)
    await conn.execute(Q["approval_insert_tool"], {
        "id": ident, "employee": req.employee, "generation": req.generation,
        "thread": req.stream_key, "turn_id": req.turn_id,
        "tool_call": f"{req.turn_id}:{req.call_id}",
        "draft": f"{req.name} {req.arguments}"[:4000],
        "audience": user if pol.approvals_by_user else None,
        "expire_after_h": pol.expire_after_h,
    })  # fmt: skip
    return ident


@dataclass(frozen=True)
class EgressPolicy:
    """A generation's rules for what leaves (its frozen spec): the channel kinds whose sends
    need approval, the time to decide, the compiled content rules, and which holds a user may
    decide in its own chat (`decided_by: user`; every other hold is the admin's alone)."""

    approve: frozenset[str]
    expire_after_h: int
    rules: Rules
    user_rules: frozenset[str] = frozenset()  # ids of the rules that say `decided_by: user`
    approvals_by_user: bool = False  # `approvals.decided_by: user`

    def holds(self, kind: str, text: str, recipient: str | None) -> list[str]:
        """Why a reply is held (rule ids, then `approval`); empty: it goes out."""
        participants = [recipient] if recipient is not None else []  # a reply's own counterpart
        held = self.rules.holds(kind, text, recipient, participants)
        if kind in self.approve:
            held.append(names.APPROVAL_HELD)
        return held

    def decider(self, held: list[str], user: str | None) -> str | None:
        """The user who may decide a hold besides the admin: the chat's user, only when every
        reason for it hands it to users (a built-in rule never does); else None (the admin's)."""
        if user is None or user == OWNER:
            return None
        by_user = self.user_rules | ({names.APPROVAL_HELD} if self.approvals_by_user else set())
        return user if held and set(held) <= by_user else None


_RULES: dict[str, Rules] = {}  # compiled rules by spec digest (a generation's spec is frozen)
RULES_CACHED_MAX = 512


async def policy(conn: Conn, employee: str, generation: int) -> EgressPolicy:
    """The generation's egress policy; its rules are compiled once per spec."""
    params = {"employee": employee, "generation": generation}
    cur = await conn.execute(Q["generation_egress_policy"], params)
    row = await cur.fetchone()
    doc = (row or {}).get("approvals") or {}
    sha = str((row or {}).get("spec_sha256") or "")
    compiled = _RULES.get(sha)
    if compiled is None:
        specs = [ContentRule.model_validate(r) for r in (row or {}).get("rules") or []]
        compiled = compile_rules(specs)
        if len(_RULES) >= RULES_CACHED_MAX:
            _RULES.clear()
        _RULES[sha] = compiled
    hours = int(doc.get("expire_after_h") or names.APPROVAL_EXPIRE_AFTER_H)
    user_rules = frozenset(str(r["id"]) for r in (row or {}).get("rules") or []
                           if r.get("decided_by") == names.DECIDED_BY_USER)  # fmt: skip
    by_user = doc.get("decided_by") == names.DECIDED_BY_USER
    return EgressPolicy(frozenset(doc.get("sends") or []), hours, compiled, user_rules, by_user)


async def hold(conn: Conn, *, outbound_id: int, employee: str, generation: int, thread: str,
               turn_id: str, audience: str | None, expire_after_h: int,
               reason: str) -> str:  # fmt: skip
    """Hold a new reply for approval (inside the save's transaction); the approval's id. A
    retried save finds its approval and changes nothing (a decided row stays decided)."""
    ident = approval_id(employee, outbound_id)
    cur = await conn.execute(Q["approval_insert"], {
        "id": ident, "employee": employee, "generation": generation, "thread": thread,
        "turn_id": turn_id, "outbound_id": outbound_id, "audience": audience,
        "expire_after_h": expire_after_h,
    })  # fmt: skip
    if await cur.fetchone() is not None:
        params = {"id": outbound_id, "approval": ident, "reason": reason[:500]}
        await conn.execute(Q["outbound_hold_for_approval"], params)
    return ident


async def read(conn: Conn, ident: str) -> ApprovalView:
    cur = await conn.execute(Q["approval_read"], {"id": ident})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no approval {ident}")
    remind = row["remind_in_s"]
    return ApprovalView(str(row["state"]), bool(row["taken"]), float(row["expires_in_s"]),
                        None if remind is None else float(remind))  # fmt: skip


async def remind(conn: Conn, ident: str) -> None:
    params = {"id": ident, "kind": names.ATTENTION_APPROVAL_EXPIRING}
    await conn.execute(Q["approval_remind"], params)


async def expire(conn: Conn, ident: str) -> str:
    """Expire it if still undecided past its time; the state it has now."""
    params = {"id": ident, "kind": names.ATTENTION_APPROVAL_EXPIRED}
    cur = await conn.execute(Q["approval_expire"], params)
    row = await cur.fetchone()
    return str((row or {"state": names.APPROVAL_PENDING})["state"])


async def take(conn: Conn, ident: str, *, to_egress: bool = False) -> str | None:
    """Act on the decision once: the state taken, or None (taken already, or undecided). An
    approved send is queued; with `to_egress` the egress's own loop sends it."""
    cur = await conn.execute(Q["approval_take"], {"id": ident, "to_egress": to_egress})
    row = await cur.fetchone()
    return None if row is None else str(row["state"])


async def decide(conn: Conn, ident: str, state: str, *, by: str, admin: bool,
                 since: datetime | None = None) -> dict[str, Any]:  # fmt: skip
    """The decision of the admin, or of the user a hold was handed to, then an intent that
    nudges the workflow (one transaction); NotFound for an approval the caller may not decide
    (the admin's: a user learns nothing of it)."""
    async with conn.transaction():
        cur = await conn.execute(Q["approval_decide"], {
            "id": ident, "state": state, "by": by, "admin": admin, "audience": by,
            "since": since,
        })  # fmt: skip
        row = await cur.fetchone()
        if row is None:
            current = await get(conn, ident, audience=by, admin=admin, since=since)
            raise Conflict(f"approval {ident} is {current['state']}, not pending")
        await conn.execute(Q["intent_insert"], {
            "employee": row["employee"], "generation": row["generation"],
            "kind": names.INTENT_APPROVAL, "revision": None,
            "payload": Jsonb({"approval": ident}),
        })  # fmt: skip
    return await get(conn, ident, audience=by, admin=admin, since=since)


def rule_of(row: dict[str, Any]) -> str:
    """The rule that held it, in the spec's words: `approvals.tools: <tool>` for a tool call,
    `approvals.sends: <channel kind>` for a send on a channel that needs approval, and
    `content_rules: <ids>` for one a content rule matched (never what matched)."""
    if row.get("kind") == "tool":
        return f"approvals.tools: {str(row.get('draft') or '').split(' ', 1)[0]}"
    held = [r for r in str(row.get("held_reason") or "").split(",") if r]
    rules = [r for r in held if r != names.APPROVAL_HELD]
    said = [f"content_rules: {', '.join(rules)}"] if rules else []
    if names.APPROVAL_HELD in held or not held:
        said.insert(0, f"approvals.sends: {row.get('channel') or 'its channel'}")
    return "; ".join(said)


def view(row: dict[str, Any], admin: bool = True) -> dict[str, Any]:
    """An approval as the API shows it; the admin also sees the rule that held it (a user's
    own approvals were handed to it by a rule; which one stays the admin's, as on the operator
    event stream)."""
    out = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()
           if k != "held_reason"}  # fmt: skip
    out["rule"] = rule_of(row) if admin else None
    return out


def _visible(row: dict[str, Any], audience: str, admin: bool, since: datetime | None) -> bool:
    """The admin sees every approval; a user only those handed to it (`decided_by: user`,
    raised in its own chat since its record was made)."""
    if admin:
        return True
    return row["audience"] == audience and (since is None or row["created_at"] >= since)


async def get(conn: Conn, ident: str, *, audience: str, admin: bool,
              since: datetime | None = None) -> dict[str, Any]:  # fmt: skip
    """One approval with its held draft; NotFound for one the caller may not see."""
    cur = await conn.execute(Q["approval_get"], {"id": ident})
    row = await cur.fetchone()
    if row is None or not _visible(row, audience, admin, since):
        raise NotFound(f"no approval {ident}")
    return view(dict(row), admin)


async def listed(conn: Conn, *, audience: str, admin: bool, state: str | None,
                 employee: str | None, limit: int,
                 since: datetime | None = None) -> list[dict[str, Any]]:  # fmt: skip
    cur = await conn.execute(Q["approvals_list"], {
        "audience": audience, "admin": admin, "state": state, "employee": employee,
        "limit": limit, "since": since,
    })  # fmt: skip
    return [view(dict(r), admin) for r in await cur.fetchall()]


async def nudge(client: Client, ident: str) -> bool:
    """Signal the approval's workflow to read its row again; False when it is not running."""
    handle = client.get_workflow_handle(workflow_id(ident))
    try:
        await handle.signal(names.SIGNAL_NUDGE)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def watch_once(conn: Conn, client: Client) -> int:
    """Decisions not taken after 10 s: nudge the workflow again; when it is gone, take the
    decision here once the generation runs (a decision made while stopped goes out on Resume).
    Returns how many were taken here."""
    params = {"after_s": names.APPROVAL_RENUDGE_S, "limit": WATCH_LIMIT}
    cur = await conn.execute(Q["approvals_untaken"], params)
    taken = 0
    for row in await cur.fetchall():
        if await nudge(client, str(row["id"])):
            continue
        if row["running"]:
            state = await take(conn, str(row["id"]), to_egress=True)
            taken += state is not None
            log.info("approval %s taken by the watchdog: %s", row["id"], state)
    return taken


async def approvals_loop(pool: AsyncConnectionPool[Conn], temporal: TemporalConnection,
                         every_s: float = WATCH_EVERY_S) -> None:  # fmt: skip
    """The approvals watchdog until cancelled (a service loop of the relay)."""
    while True:
        try:
            client = await temporal.get()
            async with pool.connection() as conn:
                await watch_once(conn, client)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Temporal or the database away: try again next time
            log.warning("approvals watchdog pass failed: %s", exc)
        await asyncio.sleep(every_s)
