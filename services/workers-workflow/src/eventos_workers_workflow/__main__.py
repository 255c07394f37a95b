"""`python -m eventos_workers_workflow`: the Temporal worker for every workflow type."""

from __future__ import annotations

import asyncio

from eventos import names
from eventos.service import configure_logging
from eventos.wiring import ConnectedConfig, build_connected
from eventos.workers import run_workflow_worker


async def main() -> None:
    cfg = ConnectedConfig.from_env("workers-workflow")
    service, connected = await build_connected(cfg)
    service.loops.append(lambda: run_workflow_worker(connected.temporal, names.WORKFLOW_QUEUE))
    await service.run()


if __name__ == "__main__":
    configure_logging()
    asyncio.run(main())
