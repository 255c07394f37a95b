"""When alarms are due: `at` with an offset, ISO 8601 durations, repeats in a time zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from eventos.alarms.timing import (
    Repeat,
    TimingInvalid,
    first_due,
    humanize,
    next_occurrence,
    parse_at,
    parse_duration,
    parse_if_late,
    parse_repeat,
)

NOW = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)


def test_at_needs_an_offset_and_a_time_within_a_year() -> None:
    assert parse_at("2026-03-28T14:30:00+01:00", NOW) == datetime(2026, 3, 28, 13, 30, tzinfo=UTC)
    assert parse_at("2026-03-28T13:00:00Z", NOW) == datetime(2026, 3, 28, 13, 0, tzinfo=UTC)
    with pytest.raises(TimingInvalid, match="has no offset"):
        parse_at("2026-03-28T14:30:00", NOW)
    with pytest.raises(TimingInvalid, match="not an ISO 8601 time"):
        parse_at("tomorrow at 9", NOW)
    with pytest.raises(TimingInvalid, match="in the past"):
        parse_at("2026-03-28T11:00:00Z", NOW)
    with pytest.raises(TimingInvalid, match="more than a year"):
        parse_at("2027-04-28T11:00:00Z", NOW)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("PT10M", 600), ("P1D", 86400), ("PT1H30M", 5400), ("P1DT12H", 129600), ("P2W", 1209600),
     ("PT0.5S", 0.5), ("PT90S", 90)],
)  # fmt: skip
def test_durations_are_iso_8601(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["10m", "PT", "P", "P1Y", "P1M", "PT0S", "P1DT", "PT-5M", ""])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(TimingInvalid):
        parse_duration(text)


def test_if_late_is_fire_or_skip_after_a_duration() -> None:
    assert parse_if_late(None) == ("fire", None)
    assert parse_if_late("fire") == ("fire", None)
    assert parse_if_late("skip_after:PT10M") == ("skip_after:PT10M", 600.0)
    with pytest.raises(TimingInvalid, match="use 'fire' or 'skip_after"):
        parse_if_late("later")
    with pytest.raises(TimingInvalid, match="not an ISO 8601 duration"):
        parse_if_late("skip_after:10 minutes")


def test_repeat_is_every_s_above_the_minimum_or_a_five_field_cron() -> None:
    assert parse_repeat({"every_s": 60}, 60, "UTC") == Repeat(every_s=60)
    assert parse_repeat({"cron": "0 8 * * 1-5"}, 60, "UTC") == Repeat(cron="0 8 * * 1-5")
    with pytest.raises(TimingInvalid, match="at least 60"):
        parse_repeat({"every_s": 30}, 60, "UTC")
    with pytest.raises(TimingInvalid, match="5 fields"):
        parse_repeat({"cron": "0 8 * *"}, 60, "UTC")
    with pytest.raises(TimingInvalid, match="invalid"):
        parse_repeat({"cron": "61 8 * * *"}, 60, "UTC")


def test_a_cron_repeat_runs_in_the_employees_zone_across_a_dst_change() -> None:
    # Berlin moves to summer time on 2026-03-29: 08:00 local is 07:00 UTC, then 06:00 UTC.
    first = first_due(None, None, Repeat(cron="0 8 * * *"), NOW, "Europe/Berlin")
    assert first == datetime(2026, 3, 29, 6, 0, tzinfo=UTC)
    before = datetime(2026, 3, 28, 7, 0, tzinfo=UTC)  # 08:00 local: that occurrence fired
    assert next_occurrence(Repeat(cron="0 8 * * *"), before, before, "Europe/Berlin") == first


def test_a_late_repeat_fires_once_and_skips_to_the_next_future_occurrence() -> None:
    due = NOW - timedelta(seconds=250)
    assert next_occurrence(Repeat(every_s=100), due, NOW, "UTC") == NOW + timedelta(seconds=50)
    assert next_occurrence(Repeat(every_s=100), NOW, NOW, "UTC") == NOW + timedelta(seconds=100)


def test_exactly_one_of_at_and_in_s() -> None:
    assert first_due(None, 90, None, NOW, "UTC") == NOW + timedelta(seconds=90)
    with pytest.raises(TimingInvalid, match="not both"):
        first_due("2026-03-28T13:00:00Z", 5, None, NOW, "UTC")
    with pytest.raises(TimingInvalid, match="exactly one of at"):
        first_due(None, None, None, NOW, "UTC")
    for bad in (0, -1, 366 * 86400):
        with pytest.raises(TimingInvalid, match="in_s must be"):
            first_due(None, bad, None, NOW, "UTC")


def test_lateness_reads_like_a_person_would_say_it() -> None:
    assert [humanize(s) for s in (4, 185, 7800, 100000)] == ["4 s", "3 min 5 s", "2 h 10 min",
                                                             "1 d 3 h"]  # fmt: skip
