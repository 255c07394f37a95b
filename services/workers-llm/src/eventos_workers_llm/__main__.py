"""`python -m eventos_workers_llm`: the LLM worker; its activity loop arrives in a later issue."""

from __future__ import annotations

import asyncio
import logging

from eventos import names
from eventos.service import configure_logging
from eventos.settings import llm_classes
from eventos.wiring import serve

if __name__ == "__main__":
    configure_logging()
    classes = llm_classes()  # fails at boot on a bad LLM_CLASS
    queues = ", ".join(names.LLM_QUEUES[c] for c in classes)
    logging.getLogger("eventos_workers_llm").info("will poll %s", queues)
    asyncio.run(serve("workers-llm"))
