"""LLM steps (SPEC §4 workers-llm, §9 class queues, §17 providers): providers, the `llm_step`
activity and the class-queue workers."""

from __future__ import annotations

from eventos.llm.activity import LlmActivities
from eventos.llm.local import LocalProvider
from eventos.llm.openai import OpenAIChatProvider, provider_http_client, status_error
from eventos.llm.providers import Provider, provider_for
from eventos.llm.worker import DEFAULT_SLOTS, llm_slots, llm_worker, run_llm_workers

__all__ = [
    "DEFAULT_SLOTS",
    "LlmActivities",
    "LocalProvider",
    "OpenAIChatProvider",
    "Provider",
    "llm_slots",
    "llm_worker",
    "provider_for",
    "provider_http_client",
    "run_llm_workers",
    "status_error",
]
