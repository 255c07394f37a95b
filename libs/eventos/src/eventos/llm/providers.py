"""Which provider answers a step (SPEC §17): `openai` (any compatible endpoint) or `local`."""

from __future__ import annotations

from typing import Protocol

import httpx
from temporalio.exceptions import ApplicationError

from eventos import names
from eventos import secret_purposes as purposes
from eventos.contracts import LlmStepInput, LlmStepOutput, ModelRef
from eventos.errors import EndpointNotAllowed, SecretUnavailable
from eventos.llm.endpoints import LlmEndpoints
from eventos.llm.local import LocalProvider
from eventos.llm.openai import OpenAIChatProvider
from eventos.settings import SecretStore

ENDPOINT_NOT_ALLOWED = names.LLM_ENDPOINT_NOT_ALLOWED


class Provider(Protocol):
    """One way to answer an LLM step."""

    name: str

    async def complete(self, step: LlmStepInput, attempt: int = 1) -> LlmStepOutput:
        """The assistant's answer, or a classified ApplicationError."""
        ...


def provider_for(
    model: ModelRef, endpoints: LlmEndpoints, secrets: SecretStore, http: httpx.AsyncClient
) -> Provider:
    """The provider that answers for `model`, calling only an endpoint on the operator's list
    (checked here, at call time: the list may have changed since the spec was applied)."""
    if model.provider == "local":
        return LocalProvider()
    if model.provider == "openai":
        try:
            endpoint = endpoints.resolve(model)
        except EndpointNotAllowed as exc:
            raise ApplicationError(
                f"model {model.name!r}: {exc.field}: {exc}; nothing was sent",
                type=ENDPOINT_NOT_ALLOWED,
                non_retryable=True,
            ) from None
        assert endpoint is not None  # provider openai always resolves to one
        key = _resolve_key(model.credential, secrets)
        return OpenAIChatProvider(http, endpoint.base_url, key)
    raise ApplicationError(
        f"unknown LLM provider {model.provider!r}", type="ProviderUnknown", non_retryable=True
    )


def _resolve_key(credential: str | None, secrets: SecretStore) -> str | None:
    if credential is None:
        return None  # a local gateway (Ollama, vLLM) without a key
    try:
        return secrets.resolve(credential, purposes.LLM).decode().strip()
    except SecretUnavailable as exc:  # missing, or declared for another purpose
        raise ApplicationError(
            f"credential {credential!r} is not available: {exc}",
            type="ProviderCredentialMissing",
            non_retryable=True,
        ) from None
