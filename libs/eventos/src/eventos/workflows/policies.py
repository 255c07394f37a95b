"""Named retry policies and timeouts: every activity call site uses one of these (RFC-0006 §5.4)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

# Idempotent bookkeeping in our own database, run as local activities: retry until it works.
DB_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)
DB_TIMEOUT = timedelta(seconds=30)

# A paid model call: retried by Temporal (provider retries are off) within the step's budget.
LLM_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(minutes=1)
)
LLM_ATTEMPT_TIMEOUT = timedelta(minutes=5)
LLM_STEP_BUDGET = timedelta(minutes=15)  # cloud endpoints (SPEC §9 parking: 15 min)
LLM_STEP_BUDGET_LOCAL = timedelta(minutes=45)  # local endpoints (45 min)
# The heartbeat timeout is the turn's (TurnInput.llm_heartbeat_s, names.LLM_HEARTBEAT_S).

# Sends are made at-most-once by their claim, so they may retry without limit.
SEND_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(minutes=1)
)
# The attempt's timeout is the turn's (TurnInput.send_timeout_s): a claim expires with it.

# The supervisor's effects in Temporal (schedules, entity Signals and Updates) and the cron
# tick's append: idempotent, so they retry until they work, each attempt bounded.
CONTROL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)
CONTROL_TIMEOUT = timedelta(minutes=2)

# A tool call: its runner decides what may repeat (the `unknown` rule), so attempts may retry,
# within a time budget; each attempt heartbeats (a dead worker is noticed in 10 s).
TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30),
    maximum_attempts=6,
)  # fmt: skip
TOOL_ATTEMPT_TIMEOUT = timedelta(minutes=1)
TOOL_BUDGET = timedelta(minutes=10)
TOOL_HEARTBEAT = timedelta(seconds=10)

# A poll's one activity (SPEC §7): every attempt ends with its own BENIGN `next_retry_delay`
# (the interval, doubled by failures). This policy paces only attempts that ended without a
# verdict (the worker died, the database was unreachable); the attempt number grows forever,
# so its interval is constant rather than exponential (which would sit at its maximum).
POLL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=10), backoff_coefficient=1.0, maximum_attempts=0
)
POLL_ATTEMPT_TIMEOUT = timedelta(minutes=2)  # the fetch's 30 s deadline and two transactions
POLL_HEARTBEAT = timedelta(seconds=10)  # a killed worker's attempt is retried this soon
