"""Why an input waits: the one gate that holds it now, and until when (pure; `waiting` reads
the facts from the database, never from Temporal, I2).

An input the relay has not sent yet meets the relay's checks in the relay's order
(eventos.delivery.relay): the Temporal breaker (nothing is claimed while it is open), the stream's
hold (`starting`, `paused`, `budget`, `window`, or any other a part of the system sets, with its
`hold_until`), a retired generation, the budget (background work past 80%), a full window;
else it goes with the relay's next pass. An input already in the entity's hands meets the
entity's (workflows/conversation.py): the breaker, the turn that holds the conversation (waiting
for an approval of its reply or of a tool call, parked, or held by the budget, else the input
is in it or waits for it), the debounce, the admission gate (paused,
budget), the queue for a slot (the class's ceiling, the employee's cap, the instance's
capacity, or another class below its floor first); else its turn starts next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from eventos import names
from eventos.contracts import AdmitRequest, DeliveryItem
from eventos.scheduling import admission, policy
from eventos.scheduling.policy import Load, SchedConfig, Waiter
from eventos.workflows.conversation import DEBOUNCE_BY_LANE, DEBOUNCE_GROUP, next_inputs

PARK_PROBE = timedelta(minutes=15)  # workflows/turn.py PARK_PROBE: a park asks again this often
BACKGROUND = (names.C3_INTERNAL, names.C4_BACKGROUND)
HOLD_TEXT = {
    names.HOLD_QUARANTINED: "the thread is quarantined after repeated failed turns; its "
    "attention item offers release",
    names.HOLD_BACKOFF: "the thread backs off after failed turns",
    names.HOLD_DEGRADED: "the employee is degraded (too many failed turns): background work "
    "waits until it recovers or the owner clears it",
}
# Holds that admission applies to a conversation's turns too (eventos.health.intensity), so
# an input already delivered waits on them as well; `degraded` holds C3/C4 only.
TURN_HOLDS = (names.HOLD_QUARANTINED, names.HOLD_BACKOFF, names.HOLD_DEGRADED)

# Gate codes (docs/timeline.md lists them with their words).
TEMPORAL_UNAVAILABLE, STARTING, PAUSED, BUDGET_HOLD = (
    "temporal_unavailable", "starting", "paused", "budget_hold")  # fmt: skip
WINDOW_FULL, RETIRED, RELAY, ROUTING = "window_full", "retired", "relay", "routing"
IN_TURN, PARKED, DEBOUNCE, DELIVERED = "in_turn", "parked", "debounce", "delivered"
CLASS_SLOT, CLASS_FLOOR, BREAKER_OPEN, EDGE_RATE = (
    "class_slot", "class_floor", "breaker_open", "edge_rate")  # fmt: skip
APPROVAL = "approval"


@dataclass(frozen=True)
class Gate:
    """What holds an input: a code, the words, and until when (None: until something
    happens, said in the words)."""

    code: str
    text: str
    until: datetime | None = None
    approval: str | None = None  # the approval it waits for (or its turn acts on)


@dataclass
class Facts:
    """What holds an employee's inputs alike, read once per answer."""

    now: datetime
    generation: int
    generation_state: str
    pause_reason: str | None
    budget_state: str
    daily_usd: Decimal | None
    used_usd: Decimal
    period_end: datetime | None
    breaker_probe_at: datetime | None = None
    breaker_opened_at: datetime | None = None
    waiters: list[Waiter] = field(default_factory=list)
    load: Load = field(default_factory=lambda: Load({}, {}, {}))
    sched: SchedConfig = field(default_factory=SchedConfig)
    running: dict[int, list[str]] = field(default_factory=dict)  # turns holding slots, by class


@dataclass
class StreamFacts:
    """One stream: its row, its window use, its open inputs and its turns."""

    row: dict[str, Any]
    window_inputs: int
    window_bytes: int
    delivered: list[DeliveryItem]
    born: dict[int, datetime]  # when each open input entered the bus
    running: dict[str, Any] | None = None  # the running turn (with its lease)
    last_ended_at: datetime | None = None
    # The turn that waits for an approval (its reply's, saved already, or a tool call's): it
    # holds the conversation until it ends (workflows/turn.py _approved, _tool_approved).
    held: dict[str, Any] | None = None


def _when(t: datetime | None) -> str:
    return t.isoformat(timespec="seconds") if t else "-"


def _breaker(f: Facts) -> Gate | None:
    if f.breaker_probe_at is None:
        return None
    return Gate(TEMPORAL_UNAVAILABLE, "Temporal is unavailable: the relay's breaker opened at "
                f"{_when(f.breaker_opened_at)}; it probes again at {_when(f.breaker_probe_at)}",
                f.breaker_probe_at)  # fmt: skip


def _budget_text(f: Facts) -> str:
    limit = "no limit" if f.daily_usd is None else f"{f.daily_usd:.2f} USD"
    who = "every class waits" if f.budget_state == names.BUDGET_MAX else (
        "background work (C3, C4) waits")  # fmt: skip
    return (f"budget {f.budget_state}: {f.used_usd:.2f} of {limit} spent or reserved today; "
            f"{who} until {_when(f.period_end)} (the period's end) or a higher limit")  # fmt: skip


def paused(f: Facts) -> Gate:
    """The generation is paused (Stop, the budget, or another reason)."""
    if f.pause_reason == names.PAUSE_BUDGET:
        return Gate(PAUSED, "paused: the daily budget is reached; it resumes at "
                    f"{_when(f.period_end)} or with a higher limit", f.period_end)  # fmt: skip
    if f.pause_reason in (None, names.PAUSE_OWNER):
        return Gate(PAUSED, "paused: stopped by the owner; Resume releases it")
    return Gate(PAUSED, f"paused ({f.pause_reason}); Resume releases it")


def _hold(f: Facts, s: StreamFacts) -> Gate | None:
    reason = s.row.get("hold_reason")
    if reason is None:
        return None
    if reason == names.HOLD_STARTING:
        return Gate(STARTING, "the generation is starting: inputs wait until it runs")
    if reason == names.HOLD_PAUSED:
        return paused(f)
    if reason == names.GATE_BUDGET:
        return Gate(BUDGET_HOLD, _budget_text(f), f.period_end)
    if reason == names.HOLD_WINDOW:
        return _window(s)
    code = str(reason).split(":", 1)[0]
    until = _hold_until(s.row)
    text = HOLD_TEXT.get(code, f"held: {reason}")
    return Gate(code, text + (f" until {_when(until)}" if until else ""), until)


def _hold_until(row: dict[str, Any]) -> datetime | None:
    """The end of a timed hold: `hold_until`, read by name from the stream's whole row so a
    hold another part of the system adds shows up with its end."""
    raw = row.get("hold_until")
    return datetime.fromisoformat(raw) if isinstance(raw, str) else None


def _window(s: StreamFacts) -> Gate:
    turn = s.running
    busy = f"; turn {turn['n']} runs since {_when(turn['started_at'])}" if turn else (
        "; no turn runs")  # fmt: skip
    if s.held is not None:
        busy = f"; turn {s.held['n']} waits for approval {s.held['approval_id']}"
    return Gate(WINDOW_FULL, f"the conversation's window is full: {s.window_inputs} inputs "
                f"({s.window_bytes // 1024} KB) delivered and not consumed, at most "
                f"{names.WINDOW_MAX_INPUTS} or {names.WINDOW_MAX_BYTES // 1024} KB{busy}; it "
                "opens as its turns consume them")  # fmt: skip


def pending_gate(f: Facts, s: StreamFacts, klass: int) -> Gate:
    """An input the relay has not sent to its conversation yet, in the relay's order."""
    gate = _breaker(f) or _hold(f, s)
    if gate is not None:
        return gate
    if f.generation_state not in (names.GEN_RUNNING, names.GEN_PAUSED):
        return Gate(RETIRED, "the generation no longer runs: the input becomes dead(reset)")
    if f.budget_state != names.BUDGET_NORMAL and klass in BACKGROUND:
        return Gate(BUDGET_HOLD, _budget_text(f), f.period_end)
    waiter = _waiter(f, s)
    if waiter is not None and waiter.takes_held and waiter.klass <= klass:
        return slot_gate(f, waiter)  # the relay holds it for the grant (eventos.delivery.held)
    full = (s.window_inputs >= names.WINDOW_MAX_INPUTS
            or s.window_bytes >= names.WINDOW_MAX_BYTES)  # fmt: skip
    if full:
        return _window(s)
    return Gate(RELAY, "waiting for the relay's next pass")


def _parked(f: Facts, turn: dict[str, Any]) -> Gate:
    why = str(turn["suspended_reason"]).split(":", 1)[-1].strip()
    since: datetime = turn["suspended_at"] or f.now
    probes = max(1, math.ceil((f.now - since) / PARK_PROBE))
    probe = since + probes * PARK_PROBE
    text = (f"turn {turn['n']} is parked ({why}): it holds no slot and asks again at "
            f"{_when(probe)}; a fixed key, Resume or a top-up releases it")  # fmt: skip
    return Gate(PARKED, text, probe)


def rule_words(kind: str | None, reasons: str | None, channel: str | None,
               tool: str | None) -> str:  # fmt: skip
    """What asked for an approval: the content rules (by id, never what matched), else
    `spec.approvals.sends` for the channel, or `spec.approvals.tools` for the tool."""
    if kind == "tool":
        return f"spec.approvals.tools ({tool or 'a tool'})"
    words = []
    for reason in (reasons or names.APPROVAL_HELD).split(","):
        if reason == names.APPROVAL_HELD:
            words.append(f"spec.approvals.sends ({channel or 'its channel'})")
        else:
            words.append(f"content rule {reason}")
    return ", ".join(words)


def approval_gate(a: dict[str, Any], behind: bool) -> Gate:
    """Waiting for an approval: which, asked by which rule, until its expiry; `behind`: the
    input waits for a turn of its conversation that waits for it."""
    what = "tool call" if a["approval_kind"] == "tool" else "reply"
    rule = rule_words(a["approval_kind"], a.get("approval_reason"), a.get("approval_channel"),
                      a.get("approval_tool"))  # fmt: skip
    who = f"turn {a['n']}'s {what}" if behind else f"its turn's {what}"
    head = f"waits for approval {a['approval_id']} of {who} ({rule})"
    if a["approval_state"] != names.APPROVAL_PENDING:  # decided: no person holds it now
        return Gate(IN_TURN, f"turn {a['n']} acts on approval {a['approval_id']} "
                    f"({a['approval_state']}) and goes on: the input is in it or starts the "
                    "next turn when it ends", None, a["approval_id"])  # fmt: skip
    if behind:
        after = "; the conversation's next turn starts once it is decided"
    elif what == "reply":
        after = "; approved, the reply goes out"
    else:
        after = "; the turn goes on once it is decided"
    expires: datetime = a["approval_expires_at"]
    return Gate(APPROVAL, f"{head}: approve or decline it; it expires at {_when(expires)}"
                f"{after}", expires, a["approval_id"])  # fmt: skip


def _in_turn(f: Facts, s: StreamFacts, chain: str | None = None) -> Gate | None:
    if s.held is not None:
        # A tool call's turn holds the inputs it took (their chains are on the turn, not
        # consumed yet) and those after them; a held reply's turn consumed its own already.
        took = s.held["status"] == "running" and chain in (s.held.get("chains") or [])
        return approval_gate(s.held, behind=not took)
    turn = s.running
    if turn is None:
        return None
    if turn["lease"] == "suspended" and turn["suspended_reason"] != names.APPROVAL_HELD:
        if str(turn["suspended_reason"] or "").startswith(names.PARKED):
            return _parked(f, turn)
        return Gate(BUDGET_HOLD, f"turn {turn['n']} waits for the budget: " + _budget_text(f),
                    f.period_end)  # fmt: skip
    return Gate(IN_TURN, f"turn {turn['n']} runs since {_when(turn['started_at'])}: the input is "
                "in it, or merges into it, or starts the next turn when it ends")  # fmt: skip


def debounce_until(lane: str, pending: list[DeliveryItem], born: dict[int, datetime],
                   after_turn: bool) -> datetime | None:  # fmt: skip
    """The entity's debounce deadline min(last + window, first + cap) over the inputs its next
    turn takes, anchored on their times in the bus (ConversationWorkflow._debounce_left)."""
    if not pending or after_turn:
        return None
    group = next_inputs(pending)
    override = group[0].route.get("debounce")
    if isinstance(override, dict):
        window = timedelta(seconds=float(override.get("window_s", 0)))
        cap = timedelta(seconds=float(override.get("cap_s", 0)))
    elif lane == names.LANE_CUSTOMER and group[0].route.get("group"):
        window, cap = DEBOUNCE_GROUP
    elif lane in DEBOUNCE_BY_LANE:
        window, cap = DEBOUNCE_BY_LANE[lane]
    else:
        return None
    times = [born[i.seq] for i in group if i.seq in born]
    if not times:
        return None
    return min(max(times) + window, min(times) + cap)


def _debounce(f: Facts, s: StreamFacts) -> Gate | None:
    first = min(s.born.values(), default=None)
    after_turn = bool(s.last_ended_at and first and s.last_ended_at > first)
    until = debounce_until(str(s.row["lane"]), s.delivered, s.born, after_turn)
    if until is None or until <= f.now:
        return None
    return Gate(DEBOUNCE, "debounce: the conversation waits for more messages until "
                f"{_when(until)}, then one turn takes them together", until)  # fmt: skip


def _admission(f: Facts, s: StreamFacts, klass: int) -> Gate | None:
    req = AdmitRequest(str(s.row["employee"]), f.generation, "", str(s.row["thread"]),
                       str(s.row["stream_key"]), klass)  # fmt: skip
    refused = admission.gate(req, f.generation_state, f.budget_state)
    if refused is None:
        return None
    if refused.gate == names.GATE_BUDGET:
        return Gate(BUDGET_HOLD, _budget_text(f), f.period_end)
    if refused.gate == names.GEN_PAUSED and f.generation_state == names.GEN_STARTING:
        return Gate(STARTING, "the generation is starting: inputs wait until it runs")
    return paused(f) if refused.gate == names.GEN_PAUSED else Gate(RETIRED, refused.reason)


def _turn_hold(f: Facts, s: StreamFacts, klass: int) -> Gate | None:
    """Supervision's holds, which admission applies to the conversation's next turn."""
    reason = s.row.get("hold_reason")
    if reason not in TURN_HOLDS:
        return None
    if reason == names.HOLD_DEGRADED and klass not in BACKGROUND:
        return None
    until = _hold_until(s.row)
    if reason == names.HOLD_BACKOFF and until is not None and until <= f.now:
        return None
    return _hold(f, s)


def delivered_gate(f: Facts, s: StreamFacts, klass: int, chain: str | None = None) -> Gate:
    """An input its conversation holds and has not consumed (of chain `chain`), in the
    entity's order."""
    gate = (_breaker(f) or _in_turn(f, s, chain) or _debounce(f, s) or _admission(f, s, klass)
            or _turn_hold(f, s, klass))  # fmt: skip
    if gate is not None:
        return gate
    waiter = _waiter(f, s)
    if waiter is not None:
        return slot_gate(f, waiter)
    return Gate(DELIVERED, "in its conversation's hands: its next turn takes it")


def _waiter(f: Facts, s: StreamFacts) -> Waiter | None:
    """The stream's entity in the admission queue, if it waits there."""
    return next((w for w in f.waiters if w.stream_key == s.row["stream_key"]), None)


def _turn_order(w: Waiter) -> tuple[datetime, datetime, str]:
    """The order admission serves a class's waiters in (eventos.scheduling.policy: the employee
    served longest ago first, then the oldest ask)."""
    never = datetime.min.replace(tzinfo=w.requested_at.tzinfo)
    return (w.served_at or never, w.requested_at, w.stream_key)


def slot_gate(f: Facts, w: Waiter) -> Gate:
    """A conversation queued for a turn slot: its class, its place, what runs."""
    k = w.klass
    same = sorted((x for x in f.waiters if x.klass == k and not x.offered), key=_turn_order)
    place = next((i + 1 for i, x in enumerate(same) if x.stream_key == w.stream_key), 1)
    runs = f.running.get(k, [])
    what = f"{len(runs)} C{k} turns run" + (f" ({', '.join(runs[:3])})" if runs else "")
    where = f"position {place} of {len(same)} waiting in C{k}; {what}"
    cfg, load = f.sched, f.load
    if w.offered:
        return Gate(CLASS_SLOT, f"a C{k} slot is kept for it: its turn starts when the "
                    "conversation asks again")  # fmt: skip
    if load.by_employee.get(w.employee, 0) >= cfg.employee_cap:
        why = f"the employee runs {cfg.employee_cap} turns, its cap"
    elif load.by_class.get(k, 0) >= cfg.class_max[k]:
        why = f"every C{k} slot is taken ({cfg.class_max[k]})"
    elif load.held() >= cfg.capacity:
        waiting = sorted({x.klass for x in f.waiters if not x.offered})
        first = policy.pick_class(waiting, dict(load.admitted))
        if first != k:
            floor = names.CLASS_FLOORS[first]
            return Gate(CLASS_FLOOR, f"waiting for a slot: C{first} is below its floor share "
                        f"({floor:.0%}) and takes the next one; {where}")  # fmt: skip
        why = f"every slot of the instance is taken ({cfg.capacity})"
    else:
        why = "a slot is free and goes to it at the next admission"
    return Gate(CLASS_SLOT, f"waiting for a C{k} slot: {why}; {where}")
