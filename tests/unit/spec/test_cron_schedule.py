"""A cron trigger's Schedule (SPEC §10): catch-up window one interval, at most an hour."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.client import ScheduleOverlapPolicy

from eventos import names
from eventos.control.supervisor import CRON_JITTER, cron_interval, cron_schedule
from eventos.spec.model import Trigger


@pytest.mark.parametrize(
    ("expr", "interval"),
    [
        ("* * * * *", timedelta(minutes=1)),
        ("*/5 * * * *", timedelta(minutes=5)),
        ("0,30 * * * *", timedelta(minutes=30)),
        ("15 */2 * * *", timedelta(hours=1)),  # every other hour: capped at one hour
        ("0 3 * * *", timedelta(hours=1)),
        ("0 9 * * 1-5", timedelta(hours=1)),
        ("@hourly", timedelta(hours=1)),
        ("@daily", timedelta(hours=1)),
        ("@every 10m", timedelta(minutes=10)),
        ("@every 1h30m", timedelta(hours=1, minutes=30)),  # the window is capped by its caller
        ("@reboot", timedelta(hours=1)),  # not cron: Temporal refuses it (schedule_refused)
    ],
)
def test_the_catch_up_window_is_one_interval_at_most_an_hour(
    expr: str, interval: timedelta
) -> None:
    assert cron_interval(expr) == interval


def test_the_schedule_fires_a_tick_workflow_keyed_by_immutable_ids() -> None:
    trigger = Trigger.model_validate({"kind": "cron", "schedule": "*/5 * * * *", "text": "go"})
    s = cron_schedule("ann", 3, "nightly", trigger, "Europe/Berlin", "workflows", paused=True)
    assert s.action.workflow == names.WF_SCHEDULE_FIRE
    assert s.action.id == "fire-cron-ann-g3-nightly"
    assert s.action.priority.priority_key == names.TRIGGER_PRIORITY
    (arg,) = s.action.args
    assert (arg.schedule_id, arg.text) == ("cron-ann-g3-nightly", "go")
    assert s.spec.cron_expressions == ["*/5 * * * *"]
    assert (s.spec.jitter, s.spec.time_zone_name) == (CRON_JITTER, "Europe/Berlin")
    assert s.policy.overlap == ScheduleOverlapPolicy.BUFFER_ONE
    assert s.policy.catchup_window == timedelta(minutes=5)
    assert s.state.paused
