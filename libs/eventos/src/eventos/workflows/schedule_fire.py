"""ScheduleFireWorkflow (SPEC §7, §10): a cron Schedule's action appends one C4 tick.

The tick's dedupe key is `<schedule>:<scheduled time>`, so a repeated action (a retried
start, a re-armed Schedule) appends it once.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    import eventos.names as names
    import eventos.workflows.policies as policies
    from eventos.contracts import ScheduleFire

SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")


@workflow.defn(name=names.WF_SCHEDULE_FIRE)
class ScheduleFireWorkflow:
    """Append the tick of one scheduled time."""

    @workflow.run
    async def run(self, req: ScheduleFire) -> bool:
        at = workflow.info().typed_search_attributes.get(SCHEDULED_START)
        scheduled_for = (at or workflow.info().start_time).isoformat()
        appended: bool = await workflow.execute_activity(
            names.ACT_FIRE_SCHEDULE, args=[req, scheduled_for],
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.CONTROL_RETRY,
        )  # fmt: skip
        return appended
