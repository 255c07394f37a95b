"""Failures say why (issue 26): the innermost cause's type, its category and a bounded
message with credentials and content removed, whatever wraps it."""

from __future__ import annotations

import pytest
from temporalio.api.enums.v1 import TimeoutType
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    RetryState,
)
from temporalio.exceptions import TimeoutError as TemporalTimeout
from temporalio.service import RPCError, RPCStatusCode

from eventos import failures
from eventos.llm.openai import status_error


def wrapped(cause: BaseException) -> ChildWorkflowError:
    """A failed turn as its entity sees it: the child's error around the step's around the
    provider's."""
    step = ActivityError("Activity task failed", scheduled_event_id=5, started_event_id=6,
                         identity="w", activity_type="llm_step", activity_id="t:step-0",
                         retry_state=RetryState.NON_RETRYABLE_FAILURE)  # fmt: skip
    step.__cause__ = cause
    turn = ChildWorkflowError("Child Workflow execution failed", namespace="default",
                              workflow_id="turn-1", run_id="r", workflow_type="TurnWorkflow",
                              initiated_event_id=1, started_event_id=2,
                              retry_state=RetryState.NON_RETRYABLE_FAILURE)  # fmt: skip
    turn.__cause__ = step
    return turn


@pytest.mark.parametrize(
    ("status", "code", "category"),
    [(401, None, "auth"), (403, None, "auth"), (402, None, "quota"),
     (429, "insufficient_quota", "quota"), (429, "rate_limit_exceeded", "rate"),
     (500, None, "outage"), (502, None, "outage"), (503, None, "outage"), (408, None, "timeout"),
     (504, None, "timeout"), (400, None, "invalid_request"), (422, None, "invalid_request"),
     (404, "model_not_found", "invalid_request")],
)  # fmt: skip
def test_a_providers_answer_is_categorised_by_its_status_through_every_wrapper(
    status: int, code: str | None, category: str
) -> None:
    err = status_error(status, {}, model="gpt-4o-mini", code=code, request_id="req_1")
    failure = failures.describe(wrapped(err))
    assert failure.category == category == failures.status_category(status, code)
    assert failure.type == err.type
    text = str(failure)
    assert text.startswith(f"{category}: {err.type}: HTTP {status}")
    assert "Activity task failed" not in text and "Child Workflow" not in text


def test_an_unknown_type_with_a_status_takes_the_statuss_category() -> None:
    err = ApplicationError("gateway said no", {"status": 429}, type="GatewayError")
    assert failures.describe(err) == failures.Failure("GatewayError", "rate", "gateway said no")


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (ApplicationError("x", type="ProviderUnreachable"), "outage"),
        (ApplicationError("x", type="ProviderOutage"), "outage"),
        (ApplicationError("x", type="BudgetExceeded"), "quota"),
        (ApplicationError("x", type="ProviderCredentialMissing"), "auth"),
        (ApplicationError("x", type="RecordRefused"), "invalid_request"),
        (ApplicationError("x", type="KeyError"), "bug"),
        (
            TemporalTimeout(
                "activity timeout",
                type=TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE,
                last_heartbeat_details=[],
            ),
            "timeout",
        ),
        (RPCError("down", RPCStatusCode.UNAVAILABLE, b""), "outage"),
        (RPCError("no", RPCStatusCode.INVALID_ARGUMENT, b""), "invalid_request"),
        (ConnectionRefusedError("refused"), "outage"),
        (TimeoutError(), "timeout"),
        (ZeroDivisionError("division by zero"), "bug"),
    ],
)
def test_every_cause_falls_in_one_category(exc: BaseException, category: str) -> None:
    assert failures.describe(exc).category == category
    assert category in failures.CATEGORIES


def test_a_timed_out_step_says_timeout_and_its_last_attempts_cause() -> None:
    """Temporal puts a retried activity's last failure below its time-out."""
    timeout = TemporalTimeout("activity ScheduleToClose timeout", last_heartbeat_details=[],
                              type=TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_CLOSE)  # fmt: skip
    timeout.__cause__ = status_error(500, {}, model="gpt-4o-mini")
    failure = failures.describe(wrapped(timeout))
    assert (failure.type, failure.category) == ("TimeoutError", "timeout")
    assert failure.message == (
        "activity ScheduleToClose timeout (last attempt: outage: ProviderServerError: HTTP 500 "
        "from the provider for model 'gpt-4o-mini')"
    )


def test_python_causes_are_walked_too_and_a_cycle_ends() -> None:
    inner = ValueError("bad spec")
    outer = RuntimeError("wrapper")
    outer.__cause__ = inner
    assert failures.describe(outer) == failures.Failure("ValueError", "bug", "bad spec")
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    failures.describe(a)  # returns: the walk is bounded


def test_the_message_loses_credentials_and_quoted_content_and_is_bounded() -> None:
    secret = "sk-live-0123456789abcdefghijklmnop"
    said = "please wire the money to my account before friday, it is urgent"
    err = ApplicationError(f"call failed: Authorization: Bearer {secret} while sending "
                           f"'{said}'\n at https://user:hunter2@example.com/x?token=abc123",
                           type="SendFailed")  # fmt: skip
    text = str(failures.describe(wrapped(err)))
    for leak in (secret, said, "hunter2", "abc123"):
        assert leak not in text
    assert "\n" not in text and "'…'" in text and "REDACTED" in text
    long = failures.describe(ApplicationError("x" * 5000, type="Boom"))
    assert len(long.message) == failures.MESSAGE_MAX and long.message.endswith("…")
    assert len(failures.reason(ApplicationError("y " * 5000, type="Boom"), 120)) <= 120


@pytest.mark.parametrize(
    ("stored", "label"),
    [
        ("rate: ProviderRateLimited: HTTP 429 (requests) from the provider", "rate"),
        ("parked for 7 days (parked: ProviderAuthError): auth: ProviderAuthError: HTTP 401", "auth"),
        ("invalid_request: RecordRefused: the database refused a record: x (23514)",
         "invalid_request"),
        ("entity cancelled", "other"),
        ("a customer wrote 'rate: high' to us", "other"),
        (None, "other"),
    ],
)  # fmt: skip
def test_a_stored_cause_names_its_category_for_a_metric(stored: str | None, label: str) -> None:
    assert failures.category_in(stored) == label


def test_a_message_that_names_its_type_says_it_once() -> None:
    err = ApplicationError(
        "ProviderAuthError: HTTP 401 from the provider", type="ProviderAuthError"
    )
    assert str(failures.describe(err)) == "auth: ProviderAuthError: HTTP 401 from the provider"
    assert str(failures.describe(ApplicationError("", type="Boom"))) == "bug: Boom"
