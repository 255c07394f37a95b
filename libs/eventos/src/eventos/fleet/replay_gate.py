"""The replay gate of an upgrade (RFC-0005 §21.2 step 4): every open run of the instance's
Temporal replayed on this code, before its workers poll.

Run in the new release's environment, so the workflow code replayed is the new one:

    python -m eventos.fleet.replay_gate [--max-runs N]   (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE)

It prints one JSON object as the last line of its output (the SDK's core logs to stdout
before it): `{"build", "open", "replayed", "failed": [{workflow_id, run_id, workflow_type,
error}], "truncated"}`, and exits 0 whenever it could read the runs (failures are data for the
upgrader, which marks their generations "needs Reset"); 3 when it could not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any, Final

from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from eventos.runtime.build import worker_build_id
from eventos.runtime.payload_guard import connect
from eventos.settings import TemporalSettings
from eventos.workers.roles import WORKFLOWS

OPEN_RUNS = 'ExecutionStatus="Running"'
ERROR_MAX = 500  # characters of a replay failure kept in the report
EXIT_UNREADABLE = 3
# Temporal may be briefly unreachable as the upgrade stops the services (its Service without a
# ready endpoint while its readiness probe fails on a loaded node): connecting is retried this
# long, then the gate cannot read the runs.
CONNECT_WAIT_S: Final = 60.0
CONNECT_RETRY_S: Final = 1.0

log = logging.getLogger(__name__)


async def open_histories(
    client: Client, max_runs: int, seen: list[str]
) -> AsyncIterator[WorkflowHistory]:
    """The histories of the open runs, at most `max_runs`; each id is appended to `seen`
    (one more than the bound is read, to tell a truncated list from a full one)."""
    async for execution in client.list_workflows(OPEN_RUNS, page_size=100):
        seen.append(execution.id)
        if len(seen) > max_runs:
            return
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        yield await handle.fetch_history()


async def gate(settings: TemporalSettings, max_runs: int) -> dict[str, Any]:
    """Replay every open run (up to `max_runs`) on this code; the report."""
    client = await _connected(settings)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=client.data_converter)
    seen: list[str] = []
    failed: list[dict[str, str]] = []
    replayed = 0
    async with replayer.workflow_replay_iterator(open_histories(client, max_runs, seen)) as runs:
        async for result in runs:
            replayed += 1
            if result.replay_failure is not None:
                failed.append(_failure(result.history, result.replay_failure))
    return {"build": worker_build_id(), "open": min(len(seen), max_runs), "replayed": replayed,
            "failed": failed, "truncated": len(seen) > max_runs}  # fmt: skip


async def _connected(settings: TemporalSettings) -> Client:
    """A client, connecting again until CONNECT_WAIT_S went by (the last error then)."""
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        try:
            return await connect(settings.address, settings.namespace)
        except RuntimeError as exc:  # the SDK's "Failed client connect: …"
            if time.monotonic() > deadline:
                raise
            log.warning("Temporal at %s not reachable (%s); again in %gs", settings.address,
                        exc, CONNECT_RETRY_S)  # fmt: skip
            await asyncio.sleep(CONNECT_RETRY_S)


def _failure(history: WorkflowHistory, exc: Exception) -> dict[str, str]:
    started = (
        history.events[0].workflow_execution_started_event_attributes if history.events else None
    )
    return {
        "workflow_id": history.workflow_id,
        "run_id": history.run_id,
        "workflow_type": started.workflow_type.name if started else "",
        "error": f"{type(exc).__name__}: {exc}"[:ERROR_MAX],
    }


def main(argv: list[str] | None = None) -> int:
    """Print the gate's report as JSON; exit 0 when the runs were read, 3 when not."""
    parser = argparse.ArgumentParser(prog="python -m eventos.fleet.replay_gate")
    parser.add_argument("--max-runs", type=int, default=5000)
    args = parser.parse_args(argv)
    if not 0 < args.max_runs <= 100_000:
        parser.error("--max-runs must be between 1 and 100000")
    try:
        report = asyncio.run(gate(TemporalSettings.from_env(), args.max_runs))
    except Exception as exc:  # the upgrader reads the reason; nothing here may hang it
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:ERROR_MAX]}))
        return EXIT_UNREADABLE
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
