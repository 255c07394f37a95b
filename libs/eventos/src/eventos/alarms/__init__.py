"""Alarms and follow-ups (SPEC §10): rows in `alarms`, set by the alarm tools or, as deadlines,
by other subsystems (`store.create_deadline`, `store.cancel_by_ref`), fired by the supervisor's
one timer. Import the module you need: this package imports nothing, so a service that only
writes alarms (the router's follow-up cancels) does not load the Temporal client with them."""
