"""The OpenAI-compatible chat-completions client (`provider: openai`) and HTTP error classes.

Provider retries are off: every failure becomes one classified `ApplicationError` and Temporal
owns retrying (SPEC §17). Error messages never carry the prompt, the reply or the key.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from eventos import failures
from eventos.contracts import ChatMessage, LlmStepInput, LlmStepOutput, ModelRef, ToolCall

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_RETRY_AFTER_S = 300.0  # a longer Retry-After is capped; the step budget decides the rest
# Non-streaming answers of large models take minutes; the activity's start-to-close bounds it.
HTTP_TIMEOUT = httpx.Timeout(300.0, connect=10.0)

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
BENIGN_STATUSES = frozenset({429, 503})  # expected under load: no error-level logs
ERROR_TYPES = {
    400: "ProviderBadRequest",
    401: "ProviderAuthError",
    402: "ProviderQuotaExceeded",  # payment required: billing, like `insufficient_quota`
    403: "ProviderAuthError",
    404: "ProviderNotFound",
    408: "ProviderTimeout",
    409: "ProviderConflict",
    422: "ProviderBadRequest",
    429: "ProviderRateLimited",
    503: "ProviderUnavailable",
    504: "ProviderTimeout",
}
# OpenAI's reasoning families refuse `max_tokens` (400 `unsupported_parameter`) and take
# `max_completion_tokens`; every other model gets `max_tokens`, the one name vLLM, Ollama and
# older gateways know. A spec's `model.options.token_limit_param` overrides the guess (a
# deployment under its own name, a gateway that renames models).
MAX_TOKENS = "max_tokens"
MAX_COMPLETION_TOKENS = "max_completion_tokens"
_REASONING_MODEL = re.compile(r"^(o1|o3|o4|gpt-5)([-.]|$)")

# Only short machine codes from an error body are quoted: its text may echo input or the key.
_SAFE_CODE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def provider_http_client(max_connections: int = 100) -> httpx.AsyncClient:
    """The HTTP client the providers share (no retries: httpx only retries connects if told)."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=20)
    return httpx.AsyncClient(timeout=HTTP_TIMEOUT, limits=limits)


def retry_after_s(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or HTTP date), capped."""
    seconds: float | None = None
    if (ms := headers.get("retry-after-ms")) is not None:
        seconds = _float(ms)
        seconds = None if seconds is None else seconds / 1000
    if seconds is None and (raw := headers.get("retry-after")) is not None:
        seconds = _float(raw)
        if seconds is None:
            seconds = _seconds_until(raw, now or datetime.now(UTC))
    if seconds is None or seconds <= 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_S)


def _float(raw: str) -> float | None:
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _seconds_until(http_date: str, now: datetime) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - now).total_seconds()


def status_error(
    status: int,
    headers: Mapping[str, str],
    *,
    model: str,
    code: str | None = None,
    request_id: str | None = None,
) -> ApplicationError:
    """The ApplicationError for an HTTP error answer (SPEC §17: Temporal owns retrying)."""
    kind = ERROR_TYPES.get(status, "ProviderServerError" if status >= 500 else "ProviderBadRequest")
    retryable = status in RETRYABLE_STATUSES or status >= 500
    if code == "insufficient_quota" or status == 402:  # billing, not load (SPEC §9 parking)
        kind, retryable = "ProviderQuotaExceeded", False
    should_retry = headers.get("x-should-retry", "").strip().lower()
    if should_retry in ("true", "false"):  # the server's own verdict wins over the status
        retryable = should_retry == "true"
    delay = retry_after_s(headers) if retryable else None
    benign = retryable and status in BENIGN_STATUSES
    category = ApplicationErrorCategory.BENIGN if benign else ApplicationErrorCategory.UNSPECIFIED
    detail = f" ({code})" if code else ""
    where = f", request {request_id}" if request_id else ""
    return ApplicationError(
        f"{kind}: HTTP {status}{detail} from the provider for model {model!r}{where}",
        {
            "status": status,
            "code": code,
            "retry_after_s": delay,
            "category": failures.status_category(status, code),
        },
        type=kind,
        non_retryable=not retryable,
        next_retry_delay=timedelta(seconds=delay) if delay else None,
        category=category,
    )


def _error_code(response: httpx.Response) -> str | None:
    try:
        error = response.json()["error"]
        code = error.get("code") or error.get("type")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return code if isinstance(code, str) and _SAFE_CODE.match(code) else None


def _request_id(response: httpx.Response) -> str | None:
    value = response.headers.get("x-request-id")
    return value if value and _SAFE_CODE.match(value) else None


def _bad_response(model: str, why: str) -> ApplicationError:
    # A malformed 2xx is usually a proxy or gateway hiccup: let Temporal try again.
    return ApplicationError(
        f"ProviderBadResponse: {why} from the provider for model {model!r}",
        type="ProviderBadResponse",
    )


@dataclass
class OpenAIChatProvider:
    """`provider: openai`: any endpoint that speaks OpenAI chat completions."""

    http: httpx.AsyncClient
    base_url: str = DEFAULT_BASE_URL
    key: str | None = field(default=None, repr=False)
    name: str = "openai"

    async def complete(self, step: LlmStepInput, attempt: int = 1) -> LlmStepOutput:
        """POST /chat/completions once; errors are classified, never retried here."""
        model = step.model.name
        url = self.base_url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        try:
            response = await self.http.post(url, json=request_body(step), headers=headers)
        except httpx.TimeoutException as exc:
            raise ApplicationError(
                f"ProviderTimeout: {type(exc).__name__} for model {model!r}", type="ProviderTimeout"
            ) from None
        except httpx.TransportError as exc:
            raise ApplicationError(
                f"ProviderUnreachable: {type(exc).__name__} for model {model!r}",
                type="ProviderUnreachable",
            ) from None
        if not response.is_success:
            code, request_id = _error_code(response), _request_id(response)
            raise status_error(
                response.status_code,
                response.headers,
                model=model,
                code=code,
                request_id=request_id,
            )
        try:
            data = response.json()
        except ValueError:
            raise _bad_response(model, "a body that is not JSON") from None
        return parse_completion(data, model)


def request_body(step: LlmStepInput) -> dict[str, Any]:
    """The chat-completions request of a step."""
    body: dict[str, Any] = {
        "model": step.model.name,
        "messages": [wire_message(m) for m in step.messages],
        token_limit_param(step.model): step.max_tokens,
    }
    if step.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in step.tools
        ]
    return body


def token_limit_param(model: ModelRef) -> str:
    """The request field of the token limit: the spec's choice, else by the model's family."""
    if model.token_limit_param:
        return model.token_limit_param
    return MAX_COMPLETION_TOKENS if _REASONING_MODEL.match(model.name.lower()) else MAX_TOKENS


def wire_message(message: ChatMessage) -> dict[str, Any]:
    """One message in OpenAI's shape."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        out["name"] = message.name
    if message.tool_calls:
        out["content"] = message.content or None  # null content is how a pure tool call looks
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return out


def parse_completion(data: Any, model: str) -> LlmStepOutput:
    """The step output of a chat-completions answer."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        calls = [
            ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
            for c in message.get("tool_calls") or []
        ]
        content = message.get("content") or message.get("refusal") or ""
        usage = data.get("usage") or {}
        return LlmStepOutput(
            message=ChatMessage("assistant", str(content), tool_calls=calls),
            finish_reason=str(choice.get("finish_reason") or "stop"),
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise _bad_response(model, "a malformed completion") from None
