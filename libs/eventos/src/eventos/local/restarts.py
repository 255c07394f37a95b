"""When a child of the local instance that exited starts again, and how its exit is said.

Every process `make run` starts (the six services, PostgreSQL, the Temporal server) is started
again after 1 s, 2 s, 4 s … (at most 30 s) while it keeps exiting soon after its start; one that
ran a minute or more before it exited is not crash-looping and comes back after 1 s again.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

RESTART_BACKOFF_MAX_S = 30.0
# A child that ran this long before it exited is not crash-looping: it restarts after the first
# delay again (Kubernetes resets its back-off the same way, after a run of 10 minutes).
RESTART_BACKOFF_RESET_S = 2 * RESTART_BACKOFF_MAX_S


@dataclass
class Restarts:
    """How often a child was started again, and when its next start is due."""

    count: int = 0
    due_at: float = 0.0  # time.monotonic() of the next start; 0 while none is planned

    @property
    def planned(self) -> bool:
        return bool(self.due_at)

    def plan(self, ran_s: float, now: float) -> float:
        """Plan the next start of a child that exited after running `ran_s`; its delay."""
        if ran_s >= RESTART_BACKOFF_RESET_S:
            self.count = 0
        delay = min(RESTART_BACKOFF_MAX_S, 2.0**self.count)
        self.due_at = now + delay
        return delay

    def due(self, now: float) -> bool:
        return self.planned and now >= self.due_at

    def begin(self) -> int:
        """A start is made now: its number (1 for the first restart)."""
        self.count += 1
        self.due_at = 0.0
        return self.count


def exit_text(returncode: int) -> str:
    """`exited with code 1`, or `was killed by SIGKILL` (Popen's negative return code)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"
