"""Alarms and follow-ups (SPEC §10): rows in `alarms`, set by the alarm tools or, as deadlines,
by other subsystems (`create_deadline`, `cancel_by_ref`), fired by the supervisor's one timer."""

from eventos.alarms.activity import signal_changed
from eventos.alarms.store import cancel_by_ref, create_deadline

__all__ = ["cancel_by_ref", "create_deadline", "signal_changed"]
