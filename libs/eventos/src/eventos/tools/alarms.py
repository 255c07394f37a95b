"""The alarm tools (SPEC §10, §17): `set_alarm`, `cancel_alarm`, `list_alarms`.

Each runs in the transaction that records the call (transactional), so a retried call sets one
alarm (its id is a hash of turn and call). An alarm fires into the thread that set it and takes
that thread's reply route. A turn sees and cancels only the alarms its own conversation set
(same employee, generation, lane and thread): another conversation's alarm is answered exactly
as an id that does not exist (no oracle; SPEC §16 EG3, EG17). After a call that set or
cancelled an alarm commits, the tool activity sends the supervisor `alarms_changed`
(`SIGNALS_SUPERVISOR`), so its one timer covers the earliest.
"""

from __future__ import annotations

from typing import Any

from eventos import names
from eventos.alarms import store
from eventos.alarms.timing import TimingInvalid, first_due, parse_if_late, parse_repeat
from eventos.settings import AlarmSettings
from eventos.tools.base import Effect, Tool, ToolContext, ToolRefused, obj

SETTINGS_KEY = "alarms"
TEXT_MAX = 2000
# Tools whose successful call changed what the supervisor's timer must cover (a delegation
# may set its task's deadline; one without is a harmless hint).
SIGNALS_SUPERVISOR = frozenset({"set_alarm", "cancel_alarm", "delegate_to_employee"})

SET_PARAMETERS = obj({
    "text": {"type": "string", "minLength": 1, "maxLength": TEXT_MAX,
             "description": "what you will read when it fires"},
    "at": {"type": "string", "maxLength": 64,
           "description": "ISO 8601 time with an offset, e.g. 2026-12-01T09:00:00+01:00"},
    "in_s": {"type": "number", "description": "seconds from now (give at or in_s)"},
    "if_late": {"type": "string", "maxLength": 64,
                "description": "fire (default: fire late, with a note) or "
                               "skip_after:<ISO 8601 duration>, e.g. skip_after:PT10M"},
    "cancel_on": {"type": "string", "enum": [names.CANCEL_ON_INBOUND],
                  "description": "inbound: cancelled when a message arrives in this thread "
                                 "(a follow-up)"},
    "repeat": {"type": "object", "minProperties": 1, "maxProperties": 1,
               "additionalProperties": False, "description": "{every_s} or {cron} (5 fields, "
                                                             "in the employee's time zone)",
               "properties": {"every_s": {"type": "integer", "minimum": 1},
                              "cron": {"type": "string", "maxLength": 128}}},
}, ["text"])  # fmt: skip


def settings_of(ctx: ToolContext) -> AlarmSettings:
    found = ctx.extras.get(SETTINGS_KEY)
    return found if isinstance(found, AlarmSettings) else AlarmSettings()


def new_alarm(ctx: ToolContext, args: dict[str, Any]) -> store.NewAlarm:
    """The alarm a `set_alarm` call asks for (ToolRefused with the reason otherwise)."""
    call, zone = ctx.call, ctx.spec.spec.timezone
    try:
        repeat = parse_repeat(args.get("repeat"), settings_of(ctx).min_every_s, zone)
        due = first_due(args.get("at"), args.get("in_s"), repeat, ctx.now, zone)
        if_late, skip_after_s = parse_if_late(args.get("if_late"))
    except TimingInvalid as exc:
        raise ToolRefused(str(exc)) from None
    return store.NewAlarm(
        id=store.alarm_id(call.turn_id, call.call_id), employee=call.employee,
        generation=call.generation, lane=call.lane, thread=call.thread, route=dict(call.route),
        agent=call.agent, text=str(args["text"]), due_at=due, chain_id=call.chain_id,
        hop=call.hop, path=list(call.path), causation_id=call.key, if_late=if_late,
        skip_after_s=skip_after_s, cancel_on=args.get("cancel_on"), repeat=repeat,
    )  # fmt: skip


async def set_alarm(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    alarm = new_alarm(ctx, args)
    try:
        await store.create(ctx.conn, alarm)
    except store.TooManyAlarms as exc:
        raise ToolRefused(str(exc)) from None
    return {"id": alarm.id, "due_at": alarm.due_at.isoformat()}


async def cancel_alarm(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    call = ctx.call
    status = await store.cancel(ctx.conn, call.employee, call.generation, call.lane,
                                call.thread, str(args["id"]))  # fmt: skip
    if status is None:
        raise ToolRefused(f"you have no alarm {args['id']!r} (list_alarms shows yours)")
    return {"id": args["id"], "status": status}


async def list_alarms(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    call = ctx.call
    alarms, total = await store.listed(ctx.conn, call.employee, call.generation, call.lane,
                                       call.thread)  # fmt: skip
    out: dict[str, Any] = {"alarms": alarms}
    if total > len(alarms):
        out["more"] = total - len(alarms)
    return out


TOOLS: list[Tool] = [
    Tool("set_alarm",
         "Set an alarm: at a time (at, ISO 8601 with an offset) or in_s seconds from now, you "
         "read its text in this conversation. Optional: if_late, cancel_on: inbound (a "
         "follow-up, cancelled when a message arrives here), repeat {every_s} or {cron}. "
         "Returns {id, due_at}.",
         SET_PARAMETERS, set_alarm, Effect.IDEMPOTENT, transactional=True),
    Tool("cancel_alarm",
         "Cancel an alarm set in this conversation by id. Returns {id, status}.",
         obj({"id": {"type": "string", "maxLength": 64}}, ["id"]), cancel_alarm,
         Effect.IDEMPOTENT, transactional=True),
    Tool("list_alarms",
         "The alarms set in this conversation: scheduled ones and those that fired, were "
         "missed or cancelled in the last day, soonest first: "
         "{alarms: [{id, text, due_at, status}]}.",
         obj({}), list_alarms, Effect.READ_ONLY, transactional=True),
]  # fmt: skip
