"""Supervision of threads and employees (SPEC §12): restart intensity per thread (backoff,
quarantine and its release), the `degraded` employee, and the watchdogs of the router, the
windows and retries.

Everything here is counted on the database's records (failed turns, holds, intents, outbox
rows), so it survives restarts and a re-arm (I10); Temporal only gets hints (`wake`).
"""
