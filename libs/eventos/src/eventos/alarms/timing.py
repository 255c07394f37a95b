"""When an alarm is due: `at` (ISO 8601 with an offset), `in_s`, ISO 8601 durations for
`if_late: skip_after:<d>`, and the next occurrence of a `repeat` (`{every_s}` or `{cron}` in the
employee's time zone). Every error is a `TimingInvalid` whose message the model reads."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from eventos import names
from eventos.errors import EventOSError

MAX_AHEAD = timedelta(days=366)  # `at` and `in_s` at most a year ahead (a leap year's worth)
MAX_IN_S = 365 * 24 * 3600
PAST_GRACE = timedelta(seconds=60)  # an `at` this far in the past still fires (at once)
# PnW, or PnDTnHnMnS (each part optional, at least one; seconds may have a fraction). Years and
# months are refused: their length depends on the calendar.
_DURATION = re.compile(
    r"^P(?:(?P<weeks>\d+)W|(?:(?P<days>\d+)D)?(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?"
    r"(?:(?P<seconds>\d+(?:[.,]\d+)?)S)?)?)$"
)


class TimingInvalid(EventOSError):
    """The alarm's time is invalid."""


@dataclass(frozen=True)
class Repeat:
    """A repeating alarm's rule: every `every_s` seconds, or at each time of `cron`."""

    every_s: int | None = None
    cron: str | None = None

    def doc(self) -> dict[str, Any]:
        return {"every_s": self.every_s} if self.every_s is not None else {"cron": self.cron}

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None) -> Repeat | None:
        if not doc:
            return None
        every = doc.get("every_s")
        return cls(every_s=int(every) if every is not None else None, cron=doc.get("cron"))


def parse_at(text: str, now: datetime) -> datetime:
    """An absolute time WITH an offset (`2026-12-01T09:00:00+01:00` or `…Z`), in UTC."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise TimingInvalid(
            f"at {text!r} is not an ISO 8601 time (e.g. 2026-12-01T09:00:00+01:00)"
        ) from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise TimingInvalid(
            f"at {text!r} has no offset: add one (e.g. {text}+01:00 or {text}Z), "
            "so the time means one instant"
        )
    at = at.astimezone(UTC)
    if at < now - PAST_GRACE:
        raise TimingInvalid(f"at {text!r} is in the past (it is {now.isoformat()} now)")
    if at > now + MAX_AHEAD:
        raise TimingInvalid(f"at {text!r} is more than a year ahead")
    return at


def parse_duration(text: str) -> timedelta:
    """An ISO 8601 duration of weeks, days, hours, minutes and seconds (`PT10M`, `P1D`,
    `P1DT12H`, `PT0.5S`), greater than zero."""
    m = _DURATION.match(text)
    if m is None or text in ("P", "PT") or text.endswith("T"):
        raise TimingInvalid(
            f"{text!r} is not an ISO 8601 duration of weeks, days, hours, minutes or seconds "
            "(e.g. PT10M, PT1H30M, P1D; years and months are not accepted)"
        )
    parts = {k: float(v.replace(",", ".")) for k, v in m.groupdict().items() if v is not None}
    duration = timedelta(**parts)
    if duration <= timedelta(0):
        raise TimingInvalid(f"duration {text!r} must be longer than zero")
    return duration


def parse_if_late(text: str | None) -> tuple[str, float | None]:
    """`fire` (the default: fire late, with a lateness note) or `skip_after:<duration>`
    (later than that: missed); with the skip bound in seconds."""
    if text is None or text == names.IF_LATE_FIRE:
        return names.IF_LATE_FIRE, None
    if not text.startswith(names.IF_LATE_SKIP_PREFIX):
        raise TimingInvalid(f"if_late {text!r}: use 'fire' or 'skip_after:<ISO 8601 duration>'")
    duration = parse_duration(text.removeprefix(names.IF_LATE_SKIP_PREFIX))
    return text, duration.total_seconds()


def parse_repeat(doc: dict[str, Any] | None, min_every_s: int, zone: str) -> Repeat | None:
    """`{every_s}` (at least `min_every_s`) or `{cron}` (5 fields, checked by cronsim)."""
    if not doc:
        return None
    if ("every_s" in doc) == ("cron" in doc):
        raise TimingInvalid("repeat takes exactly one of every_s and cron")
    if "every_s" in doc:
        every = int(doc["every_s"])
        if every < min_every_s:
            raise TimingInvalid(f"repeat.every_s must be at least {min_every_s} seconds")
        return Repeat(every_s=every)
    expr = str(doc["cron"]).strip()
    if len(expr.split()) != 5:
        raise TimingInvalid(f"repeat.cron {expr!r} must have 5 fields (minute hour day month "
                            "weekday)")  # fmt: skip
    try:
        CronSim(expr, datetime.now(ZoneInfo(zone)))
    except CronSimError as exc:
        raise TimingInvalid(f"repeat.cron {expr!r} is invalid: {exc}") from None
    return Repeat(cron=expr)


def next_cron(expr: str, after: datetime, zone: str) -> datetime:
    """The first time of `expr` strictly after `after`, in the zone's local time, in UTC."""
    local = after.astimezone(ZoneInfo(zone)).replace(microsecond=0)
    nxt: datetime = next(CronSim(expr, local))
    return nxt.astimezone(UTC)


def next_occurrence(repeat: Repeat, due: datetime, now: datetime, zone: str) -> datetime:
    """The next occurrence after a due one fired (or was missed) at `now`: occurrences that
    passed meanwhile are not made up (one fire, then the next future time)."""
    if repeat.every_s is not None:
        step = timedelta(seconds=repeat.every_s)
        passed = max(0, math.floor((now - due) / step))
        return due + step * (passed + 1)
    return next_cron(str(repeat.cron), max(due, now), zone)


def first_due(at: str | None, in_s: float | None, repeat: Repeat | None, now: datetime,
              zone: str) -> datetime:  # fmt: skip
    """The first occurrence: `at` or now + `in_s` (exactly one); a cron repeat without either
    starts at its next time."""
    if at is not None and in_s is not None:
        raise TimingInvalid("give exactly one of at and in_s, not both")
    if at is not None:
        return parse_at(at, now)
    if in_s is not None:
        if not 0 < in_s <= MAX_IN_S:
            raise TimingInvalid(f"in_s must be more than 0 and at most {MAX_IN_S} (a year)")
        return now + timedelta(seconds=in_s)
    if repeat is not None and repeat.cron is not None:
        return next_cron(repeat.cron, now, zone)
    raise TimingInvalid("give exactly one of at (ISO 8601 with an offset) and in_s (seconds)")


def humanize(seconds: float) -> str:
    """`3 min 5 s`, `2 h 10 min`, `1 d 4 h`: how late, for the model."""
    s = round(seconds)
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"
