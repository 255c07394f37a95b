"""The supervisor's start, stop, resume and reset path, its cron Schedules, EG5's customer
burst, and the upkeep sweep's item for a workflow whose task keeps failing, in-process exactly
as test_supervision, test_turns and test_upkeep run them, but on the tier L server: the
`temporal_settings` their `instance` fixture connects to is a namespace of the session's
open-source Temporal server (the chart's config), not the dev server."""

from __future__ import annotations

import pytest
from test_supervision import (  # noqa: F401 (collected here, on tier L)
    test_cron_schedule_fires_a_tick_once_per_time_and_pauses_with_stop,
    test_start_applies_through_the_supervisor_and_an_event_right_after_start_is_answered,
    test_stop_resume_reset_with_inputs_arriving_throughout,
)
from test_turns import (  # noqa: F401 (`instance` is a fixture; the test is collected here)
    instance,
    test_five_customer_messages_in_the_debounce_window_make_one_turn,
)
from test_upkeep import (  # noqa: F401 (the server's flag, on PostgreSQL visibility)
    test_a_workflow_whose_task_keeps_failing_is_an_item_until_it_closes,
)

from eventos.settings import TemporalSettings

pytestmark = [pytest.mark.temporal, pytest.mark.tier_l]


@pytest.fixture
def temporal_settings(tier_l_temporal: TemporalSettings) -> TemporalSettings:
    """This module's Temporal: a namespace of the tier L server of its own."""
    return tier_l_temporal
