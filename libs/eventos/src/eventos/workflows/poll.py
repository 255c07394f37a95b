"""PollWorkflow (SPEC §7): one activity that never completes. Each attempt polls once and ends
with a BENIGN error carrying the wait until the next poll; the workflow ends when an attempt
finds its generation no longer running (PollEnded), or when cancelled (retire)."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    import eventos.names as names
    import eventos.workflows.policies as policies
    from eventos.contracts import PollTrigger


@workflow.defn(name=names.WF_POLL)
class PollWorkflow:
    """Poll one trigger of one generation until that generation stops running."""

    @workflow.run
    async def run(self, req: PollTrigger) -> str:
        try:
            await workflow.execute_activity(
                names.ACT_POLL, req, start_to_close_timeout=policies.POLL_ATTEMPT_TIMEOUT,
                heartbeat_timeout=policies.POLL_HEARTBEAT, retry_policy=policies.POLL_RETRY,
            )  # fmt: skip
        except ActivityError as exc:
            cause = exc.cause
            if isinstance(cause, ApplicationError) and cause.type == names.POLL_ENDED:
                return cause.message
            raise
        return "the poll activity completed"  # it never does: each attempt raises
