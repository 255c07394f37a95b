"""`python -m eventos_workers_llm`: the LLM worker; its loop arrives in a later issue."""

from __future__ import annotations

import asyncio

from eventos.service import configure_logging
from eventos.wiring import serve

if __name__ == "__main__":
    configure_logging()
    asyncio.run(serve("workers-llm", wake=False))
