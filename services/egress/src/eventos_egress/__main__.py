"""`python -m eventos_egress`: the egress service; its main loop arrives in a later issue."""

from __future__ import annotations

import asyncio

from eventos.service import configure_logging
from eventos.wiring import serve

if __name__ == "__main__":
    configure_logging()
    asyncio.run(serve("egress", wake=False))
