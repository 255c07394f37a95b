"""One time format (issue 26 point 4): lists say how long ago, details say when as ISO 8601 with
the offset; `eventosctl` and the console (tests/browser/test_console_live.py runs the console's
own functions on these cases) print the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from eventos.cli import times
from eventos.cli.output import Column, table, time_columns

NOW = "2026-12-05T02:00:00.500+00:00"
# (a time, how long before NOW it was as the lists print it)
AGO_CASES = [
    ("2026-12-05T02:00:00.100+00:00", "now"),
    ("2026-12-05T01:59:48+00:00", "12s ago"),
    ("2026-12-05T01:55:00+00:00", "5m ago"),
    ("2026-12-04T23:00:00+00:00", "3h ago"),
    ("2026-12-03T01:00:00+00:00", "2d ago"),
    ("2026-12-05T06:30:00+00:00", "in 4h"),
    ("2026-12-05T08:29:30+05:30", "in 59m"),  # another offset: the same instant counts
]
# (a time, a zone, how the details print it there)
EXACT_CASES = [
    ("2026-12-05T02:03:04.999+00:00", "UTC", "2026-12-05T02:03:04+00:00"),
    ("2026-12-05T02:03:04+00:00", "Asia/Kolkata", "2026-12-05T07:33:04+05:30"),
    ("2026-07-01T12:00:00+00:00", "America/New_York", "2026-07-01T08:00:00-04:00"),
    ("2026-12-31T23:30:00-01:00", "Europe/Berlin", "2027-01-01T01:30:00+01:00"),
]


@pytest.mark.parametrize(("iso", "said"), AGO_CASES)
def test_a_list_says_how_long_ago(iso: str, said: str) -> None:
    assert times.ago(iso, datetime.fromisoformat(NOW)) == said


@pytest.mark.parametrize(("iso", "zone", "said"), EXACT_CASES)
def test_a_detail_says_when_with_its_offset(iso: str, zone: str, said: str) -> None:
    assert times.exact(iso, ZoneInfo(zone)) == said


def test_no_time_prints_nothing() -> None:
    assert times.ago(None) is None and times.exact(None) is None


def test_a_table_shows_ago_and_wide_shows_when() -> None:
    just = (datetime.now(UTC) - timedelta(minutes=5, seconds=3)).isoformat()
    columns = [Column("ID", lambda r: r["id"]), *time_columns("UPDATED", lambda r: r["at"])]
    head, row = table([{"id": 7, "at": just}], columns)
    assert head.split() == ["ID", "UPDATED"] and row.split() == ["7", "5m", "ago"]
    head, row = table([{"id": 7, "at": just}], columns, wide=True)
    assert head.split() == ["ID", "UPDATED"]
    assert row.split()[1] == times.exact(just)
    assert datetime.fromisoformat(row.split()[1]).utcoffset() is not None
