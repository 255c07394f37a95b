"""Which provider answers a step (SPEC §17): `openai` (any compatible endpoint) or `local`."""

from __future__ import annotations

from typing import Protocol

import httpx
from temporalio.exceptions import ApplicationError

from eventos.contracts import LlmStepInput, LlmStepOutput, ModelRef
from eventos.errors import SecretUnavailable
from eventos.llm.local import LocalProvider
from eventos.llm.openai import DEFAULT_BASE_URL, OpenAIChatProvider
from eventos.settings import SecretStore


class Provider(Protocol):
    """One way to answer an LLM step."""

    name: str

    async def complete(self, step: LlmStepInput, attempt: int = 1) -> LlmStepOutput:
        """The assistant's answer, or a classified ApplicationError."""
        ...


def provider_for(model: ModelRef, secrets: SecretStore, http: httpx.AsyncClient) -> Provider:
    """The provider that answers for `model`."""
    if model.provider == "local":
        return LocalProvider()
    if model.provider == "openai":
        key = _resolve_key(model.credential, secrets)
        return OpenAIChatProvider(http, model.base_url or DEFAULT_BASE_URL, key)
    raise ApplicationError(
        f"unknown LLM provider {model.provider!r}", type="ProviderUnknown", non_retryable=True
    )


def _resolve_key(credential: str | None, secrets: SecretStore) -> str | None:
    if credential is None:
        return None  # a local gateway (Ollama, vLLM) without a key
    try:
        return secrets.resolve(credential).decode().strip()
    except SecretUnavailable:
        raise ApplicationError(
            f"credential {credential!r} is not available",
            type="ProviderCredentialMissing",
            non_retryable=True,
        ) from None
