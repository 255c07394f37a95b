"""EmployeeSupervisorWorkflow, `emp-<employee>-g<gen>` (SPEC §7): a generation's control.

It holds the control block (state, revision, limits) the owner's intents set through the
Updates `set_control_state` and `set_limits`. Both carry absolute values and a revision; their
validators refuse a stale revision without writing history. Each accepted change is made true
in Temporal by an activity (schedules paused or deleted, running turns stopped at their next
merge point, entities woken or cancelled); the database side of the change was committed with
the intent. Its first run (a start, a rebuild or a re-arm: the argument comes from the
database) converges the world on the control block: the generation runs, the `start` trigger
fires once, the cron Schedules exist. One live timer serves every named absolute deadline:
the daily roll, the budget period's end (the owner's midnight plus the employee's offset, read
from the ledger) and the earliest scheduled alarm (`alarms`, read by `fire_due_alarms`, which
fires what is due first). At the period's end, after a limit change, or on `budget_changed`, the
ledger lowers the budget's state: a budget pause is lifted (the supervisor adopts the control
block the ledger wrote), held work is woken and suspended turns are released. It continues
as new when the server suggests it, daily, or at 1,800 Updates, and completes once the
generation is retired. `alarms_changed` (a hint, I1) makes it read the earliest alarm again; so
does a control change, every run's start (a rebuild or re-arm reads the database: EG13) and,
as a reconciliation, an hour without either. A paused generation's alarms wait for Resume.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import eventos.names as names
    import eventos.workflows.policies as policies
    from eventos.contracts import (
        AlarmsDue,
        ApplyControl,
        BudgetRefresh,
        BudgetStatus,
        Control,
        FireAlarms,
        SetControl,
        SetLimits,
        SupervisorInput,
        SupervisorStatus,
    )

ROLL_EVERY = timedelta(days=1)
ALARMS_RECHECK = timedelta(hours=1)  # the alarms are read again at least this often (I1)
CONTROL_STATES = (names.GEN_RUNNING, names.GEN_PAUSED, names.GEN_RETIRED)


@workflow.defn(name=names.WF_SUPERVISOR)
class EmployeeSupervisorWorkflow:
    """One generation's control state, its revision and its one timer."""

    @workflow.init
    def __init__(self, arg: SupervisorInput) -> None:
        self.arg = arg
        self.control = arg.control
        self.updates = 0
        self.lock = asyncio.Lock()  # control changes take effect one at a time, in order
        self.state_revision = arg.control.revision  # of the newest state change
        self.deadlines: dict[str, datetime] = {}
        self.budget_due = True  # ask the ledger (first run, period end, top-up, Signal)
        self.alarms_due = True  # read the alarms (every run's start, Signal, deadline)
        self.alarms_state = ""  # the control state the alarms deadline was armed in

    def _check_revision(self, revision: int) -> None:
        if revision <= self.control.revision:
            raise ValueError(
                f"stale revision {revision}: the control is at revision {self.control.revision}"
            )
        if self.control.state == names.GEN_RETIRED:
            raise ValueError(f"generation {self.arg.generation} is retired")

    @workflow.update(name=names.UPDATE_SET_CONTROL)
    async def set_control_state(self, req: SetControl) -> SupervisorStatus:
        """Move the generation to `req.state` (running, paused or retired)."""
        self.updates += 1
        self.control = Control(req.state, req.revision, self.control.limits, req.pause_reason)
        self.state_revision = req.revision
        async with self.lock:
            if self.state_revision == req.revision:  # no newer state change overtook it
                await self._apply(req.state)
        return self.status()

    @set_control_state.validator
    def _check_control(self, req: SetControl) -> None:
        """A newer revision and a known state only (no history written otherwise)."""
        if req.state not in CONTROL_STATES:
            raise ValueError(f"unknown control state {req.state!r}; use {CONTROL_STATES}")
        self._check_revision(req.revision)

    @workflow.update(name=names.UPDATE_SET_LIMITS)
    def set_limits(self, req: SetLimits) -> SupervisorStatus:
        """Replace the limits block (budgets and periods use it from the scheduler on)."""
        self.updates += 1
        c = self.control
        self.control = Control(c.state, req.revision, dict(req.limits), c.pause_reason)
        self.budget_due = True  # a top-up may lower the budget's state
        return self.status()

    @set_limits.validator
    def _check_limits(self, req: SetLimits) -> None:
        self._check_revision(req.revision)

    @workflow.signal(name=names.SIGNAL_BUDGET_CHANGED)
    def budget_changed(self) -> None:
        """The budget's limit or period changed outside an Update: ask the ledger again."""
        self.budget_due = True

    @workflow.signal(name=names.SIGNAL_ALARMS_CHANGED)
    def alarms_changed(self) -> None:
        """An alarm was set or cancelled: read the earliest again."""
        self.alarms_due = True

    @workflow.query(name=names.QUERY_STATUS)
    def status(self) -> SupervisorStatus:
        c = self.control
        return SupervisorStatus(
            employee=self.arg.employee, generation=self.arg.generation, state=c.state,
            revision=c.revision, limits=dict(c.limits), updates=self.updates,
            deadlines={k: v.isoformat() for k, v in sorted(self.deadlines.items())},
        )  # fmt: skip

    async def _apply(self, state: str, *, first: bool = False) -> None:
        req = ApplyControl(self.arg.employee, self.arg.generation, state, first=first,
                           pause_reason=self.control.pause_reason)  # fmt: skip
        await workflow.execute_activity(
            names.ACT_APPLY_CONTROL, req,
            start_to_close_timeout=policies.CONTROL_TIMEOUT, retry_policy=policies.CONTROL_RETRY,
        )  # fmt: skip

    async def _budget(self) -> None:
        """Let the ledger lower the budget's state; adopt a lifted pause; next deadline."""
        self.budget_due = False
        req = BudgetRefresh(self.arg.employee, self.arg.generation)
        async with self.lock:
            done = await workflow.execute_activity(
                names.ACT_BUDGET_REFRESH, req, result_type=BudgetStatus,
                start_to_close_timeout=policies.CONTROL_TIMEOUT,
                retry_policy=policies.CONTROL_RETRY,
            )  # fmt: skip
            if done.control is not None and done.control.revision > self.control.revision:
                self.control = done.control
                self.state_revision = done.control.revision
        self.deadlines["budget"] = done.period_end

    async def _alarms(self) -> None:
        """Fire what is due (a running generation's only) and arm the `alarms` deadline at the
        earliest scheduled alarm, at most ALARMS_RECHECK ahead."""
        self.alarms_due, self.alarms_state = False, self.control.state
        if self.control.state != names.GEN_RUNNING:
            self.deadlines.pop("alarms", None)  # paused: they fire after Resume
            return
        done = await workflow.execute_activity(
            names.ACT_FIRE_ALARMS, FireAlarms(self.arg.employee, self.arg.generation),
            result_type=AlarmsDue, start_to_close_timeout=policies.CONTROL_TIMEOUT,
            retry_policy=policies.CONTROL_RETRY,
        )  # fmt: skip
        recheck = workflow.now() + ALARMS_RECHECK
        self.deadlines["alarms"] = min(done.next_due, recheck) if done.next_due else recheck

    def _should_roll(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or self.updates >= self.arg.roll_after

    async def _sleep(self) -> list[str]:
        """The one live timer: until the earliest named deadline, a control change or a roll
        condition. Returns the names of the deadlines that are due."""
        revision, now = self.control.revision, workflow.now()
        wake_at = min(self.deadlines.values())
        if wake_at > now:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: (
                        self.control.revision != revision
                        or self.control.state == names.GEN_RETIRED
                        or self.budget_due
                        or self.alarms_due
                        or self._should_roll()
                    ),
                    timeout=max(wake_at - now, timedelta(seconds=1)),
                )
        now = workflow.now()
        return sorted(k for k, at in self.deadlines.items() if at <= now)

    @workflow.run
    async def run(self, arg: SupervisorInput) -> SupervisorStatus:
        if not arg.continued:
            async with self.lock:
                await self._apply(self.control.state, first=True)
                c = self.control
                if c.state == names.GEN_STARTING:  # the first run activated the generation
                    self.control = Control(names.GEN_RUNNING, c.revision, c.limits)
        self.deadlines["roll"] = workflow.now() + ROLL_EVERY
        while True:
            due = []
            if self.control.state != names.GEN_RETIRED and not self._should_roll():
                if self.budget_due:
                    await self._budget()
                if self.alarms_due or self.alarms_state != self.control.state:
                    await self._alarms()
                due = await self._sleep()
                self.budget_due = self.budget_due or "budget" in due
                self.alarms_due = self.alarms_due or "alarms" in due
            if self.control.state == names.GEN_RETIRED or self._should_roll() or "roll" in due:
                await workflow.wait_condition(workflow.all_handlers_finished)
                # No await between this check and the close: a late Update is handled first.
                if self.control.state == names.GEN_RETIRED:
                    return self.status()
                workflow.continue_as_new(
                    SupervisorInput(
                        arg.employee,
                        arg.generation,
                        self.control,
                        continued=True,
                        roll_after=arg.roll_after,
                    )
                )
