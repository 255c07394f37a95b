"""ApprovalWorkflow (SPEC §7, §11): waits on one approval row and returns what became of it.

It reads the row (the database's clock gives the seconds to the reminder and to expiry), then
waits for a `nudge()` Signal — sent after a decision is written — or the nearer deadline: at
24 h before expiry it raises the one reminder, at expiry it expires the row. It returns
approved, declined or expired; its parent takes the decision and runs the send once. It never
acts on the decision itself, so a parent that is gone leaves the decision to the watchdog.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import eventos.names as names
    import eventos.workflows.policies as policies
    from eventos.contracts import ApprovalView

MIN_WAIT_S = 1.0  # no sub-second timers (SPEC §7)
MAX_WAIT_S = 6 * 3600.0  # re-read at least this often (a changed deadline is seen)


@workflow.defn(name=names.WF_APPROVAL)
class ApprovalWorkflow:
    @workflow.init
    def __init__(self, approval_id: str) -> None:
        self.nudges = 0
        self.seen = 0  # the nudges counted when the row was last read

    @workflow.signal(name=names.SIGNAL_NUDGE)
    def nudge(self) -> None:
        """Read the row again (a decision was written); no payload: the row is the truth."""
        self.nudges += 1

    async def _local(self, name: str, approval_id: str, result_type: type | None = None) -> object:
        return await workflow.execute_local_activity(
            name, approval_id, result_type=result_type,
            start_to_close_timeout=policies.DB_TIMEOUT, retry_policy=policies.DB_RETRY,
        )  # fmt: skip

    @workflow.run
    async def run(self, approval_id: str) -> str:
        while True:
            self.seen = self.nudges
            view = await self._local(names.ACT_APPROVAL_READ, approval_id, ApprovalView)
            assert isinstance(view, ApprovalView)
            if view.state != names.APPROVAL_PENDING:
                return view.state
            if view.expires_in_s <= 0:
                state = await self._local(names.ACT_APPROVAL_EXPIRE, approval_id, str)
                if state != names.APPROVAL_PENDING:
                    return str(state)
            if view.remind_in_s is not None and view.remind_in_s <= 0:
                await self._local(names.ACT_APPROVAL_REMIND, approval_id)
                continue
            deadlines = [view.expires_in_s, MAX_WAIT_S]
            if view.remind_in_s is not None:
                deadlines.append(view.remind_in_s)
            wait = timedelta(seconds=max(MIN_WAIT_S, min(deadlines)))
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self.nudges != self.seen, timeout=wait)
