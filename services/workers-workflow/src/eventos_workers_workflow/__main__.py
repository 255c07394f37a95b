"""`python -m eventos_workers_workflow`: the workflow worker; its loop comes later."""

from __future__ import annotations

import asyncio

from eventos.service import configure_logging
from eventos.wiring import serve

if __name__ == "__main__":
    configure_logging()
    asyncio.run(serve("workers-workflow", wake=False))
