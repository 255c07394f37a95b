"""One root error type; each subclass's docstring is its default message."""

from __future__ import annotations


class EventOSError(Exception):
    """Event OS error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(EventOSError):
    """The configuration is invalid."""


class DatabaseUnavailable(EventOSError):
    """The database is unavailable."""


class RecordInvalid(EventOSError):
    """The record cannot be stored (its own data is at fault, not the database)."""


class SecretUnavailable(EventOSError):
    """A referenced secret cannot be resolved."""


class SpecInvalid(EventOSError):
    """The employee spec is invalid."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in errors))


class NotFound(EventOSError):
    """Not found."""


class Conflict(EventOSError):
    """The request conflicts with the current state."""


class Gone(EventOSError):
    """What was asked for is no longer kept."""


class QueueFull(EventOSError):
    """The queue is full."""

    def __init__(self, message: str | None = None, retry_after_s: float | None = None) -> None:
        self.retry_after_s = retry_after_s  # when trying again may succeed (Retry-After)
        super().__init__(message)


class SignatureInvalid(EventOSError):
    """The request signature is invalid."""


class EventRejected(EventOSError):
    """The event is invalid."""


class BudgetExceeded(EventOSError):
    """The step would pass the employee's daily budget: the turn suspends and the employee
    pauses until its next period or a top-up."""


class BudgetHeld(EventOSError):
    """The employee's budget is past 80%: background work waits for its next period or a
    top-up."""


class RecipientUnreadable(EventOSError):
    """An outbox recipient cannot be opened: its key is not configured, or the ciphertext was
    altered or moved from another row."""


class EndpointNotAllowed(EventOSError):
    """The model's endpoint is not one the operator allows (EVENTOS_LLM_ENDPOINTS)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class InputInvalid(EventRejected):
    """The request is invalid."""

    def __init__(self, path: str, message: str) -> None:
        self.errors = [(path, message)]
        super().__init__(f"{path}: {message}")


class BodyTooLarge(EventRejected):
    """The request body is over its cap."""


class Unauthenticated(EventOSError):
    """A valid bearer token is required."""


class Forbidden(EventOSError):
    """This token may not do that."""


class PollFailed(EventOSError):
    """The polled endpoint gave no usable page; `category` says why as eventos.failures names
    it (an answer the trigger cannot read is an invalid request's)."""

    def __init__(self, message: str | None = None, retry_after_s: float | None = None,
                 category: str = "invalid_request") -> None:  # fmt: skip
        self.retry_after_s = retry_after_s  # a 429's Retry-After: the next poll not sooner
        self.category = category
        super().__init__(message)
