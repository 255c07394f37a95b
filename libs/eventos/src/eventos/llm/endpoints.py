"""The LLM endpoints the operator allows (`EVENTOS_LLM_ENDPOINTS`): where a model may be called
and which credentials may be sent there.

A spec never decides alone where a credential goes: a credential must be listed for the
endpoint (or the operator lists `*`: any secret declared for `llm`; SecretStore checks the
purpose at every use), and its `model` names a configured endpoint
(`endpoint: openai`) or gives a `base_url` equal to a configured endpoint's. `apply` refuses
anything else (SpecInvalid, by field path), and the LLM worker checks again at call time (the
list may have changed since), so a key is only ever sent to an address on the operator's list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from eventos.errors import ConfigError, EndpointNotAllowed
from eventos.settings import LLM_ENDPOINTS_VAR, LlmEndpointSettings

VAR = LLM_ENDPOINTS_VAR
OPENAI_BASE_URL = "https://api.openai.com/v1"
ANY_CREDENTIAL = "*"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class ModelLike(Protocol):
    """What a spec's `model` and a step's ModelRef both say about where they call."""

    @property
    def provider(self) -> str: ...
    @property
    def endpoint(self) -> str | None: ...
    @property
    def base_url(self) -> str | None: ...
    @property
    def credential(self) -> str | None: ...


def normalize_url(url: str) -> str | None:
    """The URL as compared (scheme and host lower-cased, no trailing slash), or None when it is
    not an http(s) URL with a host and without user info, query or fragment."""
    try:
        parts = urlsplit(url.strip())
        _ = parts.port  # a bad port raises here
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    if "@" in parts.netloc or parts.query or parts.fragment:
        return None
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


@dataclass(frozen=True)
class Endpoint:
    """One allowed endpoint: its base URL and the credentials (secret references) it may get."""

    name: str
    base_url: str
    credentials: tuple[str, ...] = ()

    def allows(self, credential: str | None) -> bool:
        """A call without a credential sends no secret; one with a credential must be listed."""
        return (
            credential is None
            or ANY_CREDENTIAL in self.credentials
            or (credential in self.credentials)
        )


# Unset, the official endpoint may be called but is given no credential: which key goes to a
# host is the operator's word (`credentials`), never a spec's alone (docs/security.md).
DEFAULT_ENDPOINTS = (Endpoint("openai", OPENAI_BASE_URL, ()),)


def _endpoint(name: object, doc: object, var: str) -> Endpoint:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{var}: endpoint names must match {NAME_RE.pattern}, got {name!r}")
    if not isinstance(doc, dict) or set(doc) - {"base_url", "credentials"}:
        raise ConfigError(f"{var}: endpoint {name!r} must be {{base_url, credentials}}")
    raw_url = doc.get("base_url")
    base_url = normalize_url(raw_url) if isinstance(raw_url, str) else None
    if base_url is None:
        raise ConfigError(f"{var}: endpoint {name!r}: base_url must be an http(s) URL "
                          "without user info, query or fragment")  # fmt: skip
    credentials = doc.get("credentials", [])
    if not isinstance(credentials, list) or not all(
        isinstance(c, str) and (c == ANY_CREDENTIAL or NAME_RE.match(c)) for c in credentials
    ):
        raise ConfigError(f"{var}: endpoint {name!r}: credentials must be a list of secret "
                          f"references (or {ANY_CREDENTIAL!r} for any)")  # fmt: skip
    return Endpoint(name, base_url, tuple(credentials))


@dataclass(frozen=True)
class LlmEndpoints:
    """The allowed endpoints. Unset: the official OpenAI endpoint, no credential."""

    endpoints: tuple[Endpoint, ...] = DEFAULT_ENDPOINTS
    _by_name: dict[str, Endpoint] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {e.name: e for e in self.endpoints})

    @classmethod
    def from_doc(cls, doc: Any, var: str = VAR) -> LlmEndpoints:
        """From `{"<name>": {"base_url": "https://…", "credentials": ["<ref>", …]}}`."""
        if not isinstance(doc, dict):
            raise ConfigError(f"{var} must be a JSON object of endpoints by name")
        return cls(tuple(_endpoint(name, d, var) for name, d in doc.items()))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LlmEndpoints:
        """Read once at boot; a bad value fails naming the variable."""
        raw = LlmEndpointSettings.from_env(env).document
        if not raw:
            return cls()
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{VAR} is not valid JSON: {exc.msg} at {exc.pos}") from None
        return cls.from_doc(doc)

    def _allowed(self) -> str:
        if not self.endpoints:
            return f"no endpoint is configured ({VAR})"
        return f"allowed: {', '.join(self._by_name)} ({VAR})"

    def resolve(self, model: ModelLike) -> Endpoint | None:
        """The endpoint a model calls (None for the local provider), or EndpointNotAllowed
        naming the field at fault."""
        if model.provider != "openai":
            return None
        if model.endpoint is not None:
            chosen = self._named(model.endpoint, model.base_url)
        else:
            chosen = self._by_url(model.base_url, model.credential)
        if not chosen.allows(model.credential):
            why = f"endpoint {chosen.name!r} does not allow credential {model.credential!r}"
            raise EndpointNotAllowed("credential", f"{why} ({VAR})")
        return chosen

    def _named(self, name: str, base_url: str | None) -> Endpoint:
        chosen = self._by_name.get(name)
        if chosen is None:
            raise EndpointNotAllowed("endpoint", f"no endpoint named {name!r}; {self._allowed()}")
        if base_url is not None and normalize_url(base_url) != chosen.base_url:
            why = f"not the base_url of endpoint {chosen.name!r}"
            raise EndpointNotAllowed("base_url", f"{why} ({VAR})")
        return chosen

    def _by_url(self, base_url: str | None, credential: str | None) -> Endpoint:
        wanted = normalize_url(base_url or OPENAI_BASE_URL)
        found = [e for e in self.endpoints if e.base_url == wanted]
        if not found and base_url is not None:
            raise EndpointNotAllowed("base_url", f"not an allowed endpoint; {self._allowed()}")
        if not found:
            why = f"none given, and the default {OPENAI_BASE_URL} is not an allowed endpoint"
            raise EndpointNotAllowed("endpoint", f"{why}; {self._allowed()}")
        # Two names for one URL: the one that allows the credential, if any does.
        return next((e for e in found if e.allows(credential)), found[0])
