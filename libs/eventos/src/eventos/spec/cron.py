"""Which cron expressions and time zones a cron trigger may name: those cronsim (the library the
alarms use) and Temporal's Schedules both accept and read alike (docs/timers.md).

Temporal takes 5 to 7 fields, `@every`, the `@daily` family, a `TZ=` prefix and a `#` comment;
cronsim takes `L`, `W` and `#` (the nth weekday). Accepted here is what both mean the same way:
5 fields of numbers, names, `*`, `,`, `-` and `/`; the macros `@hourly`, `@daily`, `@midnight`,
`@weekly`, `@monthly`, `@yearly` and `@annually`; and `@every <duration>` (days, hours, minutes,
seconds; at least a minute). The zone is the employee's `timezone`, never a prefix.
"""

from __future__ import annotations

import re
import zoneinfo
from datetime import datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
EVERY_MIN = timedelta(minutes=1)
_FIELD = re.compile(r"^[0-9A-Za-z*,/-]+$")
_EVERY = re.compile(r"^@every\s+((?:\d+[dhms])+)$")
_EVERY_PART = re.compile(r"(\d+)([dhms])")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
NAMES = {  # the names a field may use, by its position
    3: frozenset(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
    ),
    4: frozenset(("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
}
# Names zoneinfo lists that are not one place's time: the machine's own zone, a placeholder.
NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})


class CronInvalid(ValueError):
    """The expression or zone cannot run as a Schedule; the message says why."""


def every(expr: str) -> timedelta | None:
    """The interval of an `@every` expression, else None."""
    m = _EVERY.match(expr.strip())
    if m is None:
        return None
    parts = {_UNITS[u]: int(n) for n, u in _EVERY_PART.findall(m.group(1))}
    return timedelta(**parts)


def five_fields(expr: str) -> str | None:
    """The expression as 5 fields (a macro spelled out), or None for `@every`."""
    expr = expr.strip()
    if expr.startswith("@every"):
        return None
    return MACROS.get(expr, expr)


def check_cron(expr: str) -> str:
    """The expression when it can run; else CronInvalid naming what is wrong."""
    text = expr.strip()
    if text.startswith("@every"):
        interval = every(text)
        if interval is None:
            raise CronInvalid(f"{expr!r}: @every takes a duration such as 10m, 1h30m or 1d")
        if interval < EVERY_MIN:
            raise CronInvalid(f"{expr!r}: @every must be at least a minute")
        return expr
    if text.startswith("@"):
        known = ", ".join([*MACROS, "@every <duration>"])
        if text not in MACROS:  # as Temporal spells them (lower case)
            raise CronInvalid(f"{expr!r}: unknown macro; use one of {known}")
        return expr
    fields = text.split()
    if len(fields) != 5:
        raise CronInvalid(f"{expr!r} must have 5 fields (minute hour day-of-month month "
                          "day-of-week), or be a macro such as @daily or @every 10m")  # fmt: skip
    for i, (name, field) in enumerate(zip(FIELD_NAMES, fields, strict=True)):
        words = {w.lower() for w in re.findall(r"[A-Za-z]+", field)}
        if not _FIELD.match(field) or not words <= NAMES.get(i, frozenset()):
            raise CronInvalid(
                f"{expr!r}: the {name} field {field!r} takes numbers, *, ',', '-' and '/' "
                "(and month or day names) only: no L, W, ? or #"
            )
    try:
        next(CronSim(text, datetime(2000, 1, 1)))
    except (CronSimError, StopIteration) as exc:
        raise CronInvalid(f"{expr!r} is invalid: {exc}") from None
    # A step is taken by both only within its field's range (cronsim lets `*/61` through).
    limits = (60, 24, 31, 12, 7)
    for name, field, limit in zip(FIELD_NAMES, fields, limits, strict=True):
        for step in re.findall(r"/(\d+)", field):
            if int(step) > limit:
                raise CronInvalid(f"{expr!r}: the {name} field's step {step} is over {limit}")
    return expr


@cache
def known_zones() -> frozenset[str]:
    """The IANA zone names a spec may name (the Temporal server loads the same database)."""
    return frozenset(zoneinfo.available_timezones() - NOT_ZONES)


def check_zone(name: str) -> str:
    """The zone when it is a known IANA name; else CronInvalid."""
    if name not in known_zones():
        raise CronInvalid(f"unknown time zone {name!r}: use an IANA name such as Europe/Paris")
    ZoneInfo(name)
    return name


def interval_after(expr: str, zone: str, at: datetime) -> timedelta | None:
    """How long after `at` the schedule's next time comes (one interval, SPEC §15: a tick
    pending longer is stale); None for what is not an expression this module accepts."""
    gap = every(expr)
    if gap is not None:
        return gap
    try:
        nxt = next(CronSim(five_fields(expr) or expr, at.astimezone(ZoneInfo(zone))))
    except (CronSimError, ValueError, KeyError, StopIteration, zoneinfo.ZoneInfoNotFoundError):
        return None
    return nxt - at
