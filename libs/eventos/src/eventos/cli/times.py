"""How `eventosctl` prints a time, the same way as the web console (docs/cli.md#times): a list
says how long ago (`12s ago`, `5m ago`, `3h ago`, `2d ago`; `in 4h` ahead; `now` within a
second); a detail (`-o wide`, `describe`) says when, as ISO 8601 to the second with the local
offset (`2026-12-05T03:04:05+01:00`). `-o json|yaml` print the API's own times untouched.
"""

from __future__ import annotations

from datetime import datetime, tzinfo

# Each step: below this many seconds, count in units of that many seconds with this suffix.
STEPS = ((60, 1, "s"), (3600, 60, "m"), (86400, 3600, "h"))
DAY_S = 86400


def _parse(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def ago(iso: str | None, now: datetime | None = None) -> str | None:
    """`iso` relative to now: `now`, `12s ago`, `5m ago`, `3h ago`, `2d ago`, or `in 4h`."""
    if not iso:
        return None
    then = _parse(iso)
    seconds = ((now or datetime.now(then.tzinfo)) - then).total_seconds()
    span = abs(seconds)
    if span < 1:
        return "now"
    word = f"{int(span // DAY_S)}d"
    for below, unit, suffix in STEPS:
        if span < below:
            word = f"{int(span // unit)}{suffix}"
            break
    return f"in {word}" if seconds < 0 else f"{word} ago"


def exact(iso: str | None, zone: tzinfo | None = None) -> str | None:
    """`iso` as ISO 8601 to the second in the local zone (or `zone`), with its offset."""
    if not iso:
        return None
    return _parse(iso).astimezone(zone).isoformat(timespec="seconds")
