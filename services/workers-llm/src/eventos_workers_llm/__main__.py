"""`python -m eventos_workers_llm`: runs LLM steps from the class queues of `LLM_CLASS`."""

from __future__ import annotations

import logging

from eventos import names
from eventos.llm.activity import LlmActivities
from eventos.llm.buckets import RateLimits
from eventos.llm.endpoints import LlmEndpoints
from eventos.llm.openai import provider_http_client
from eventos.llm.prices import PriceTable
from eventos.llm.worker import llm_slots, run_llm_workers
from eventos.runtime.service import run_main
from eventos.runtime.wiring import ConnectedConfig, build_connected
from eventos.settings import SecretStore, llm_classes

log = logging.getLogger("eventos_workers_llm")


async def main() -> None:
    classes = llm_classes()  # bad LLM_CLASS or slot counts fail at boot
    slots = llm_slots()
    prices, limits = PriceTable.from_env(), RateLimits.from_env()
    endpoints = LlmEndpoints.from_env()  # where credentials may go; re-checked on every call
    service, connected = await build_connected(ConnectedConfig.from_env("workers-llm"))
    http = provider_http_client(max_connections=sum(slots[c] for c in classes))
    activities = LlmActivities(http, SecretStore.from_env(), connected.pool, prices, limits,
                               endpoints=endpoints)  # fmt: skip
    service.loops.append(lambda: run_llm_workers(connected.temporal, classes, activities, slots))
    service.on_stop.append(http.aclose)
    queues = ", ".join(f"{names.LLM_QUEUES[c]} ({slots[c]} slots)" for c in classes)
    log.info("polling %s", queues)
    await service.run()


if __name__ == "__main__":
    run_main("workers-llm", main())
