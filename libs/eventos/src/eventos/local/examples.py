"""The employees in `examples/` that `make run` applies and starts (SPEC §17 Local instance).

A spec is skipped when a secret it references (model credential, webhook secret, channel
account) cannot be resolved the way the services would resolve it: from EVENTOS_SECRET_<NAME>
or a file in the secrets directory. So a fresh checkout starts only what needs no credentials,
and dropping `openai-main` into `.eventos/secrets/` is enough to bring the next one up.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from eventos.client.owner_api import OwnerApiError, OwnerClient
from eventos.errors import SecretUnavailable, SpecInvalid
from eventos.settings import SecretStore
from eventos.spec.model import EmployeeSpec, parse_spec
from eventos.spec.secret_uses import secret_uses

# What the examples' secrets are for, and the credential the official OpenAI endpoint may get:
# `make run` is the operator of its instance and declares them when its environment does not
# (EVENTOS_SECRETS_PURPOSES, EVENTOS_LLM_ENDPOINTS; docs/security.md).
EXAMPLE_OPERATOR_ENV = {
    "EVENTOS_SECRETS_PURPOSES": "openai-main=llm stripe-whsec=webhook deploy-hook=webhook",
    "EVENTOS_LLM_ENDPOINTS": '{"openai": {"base_url": "https://api.openai.com/v1", '
    '"credentials": ["openai-main"]}}',
}

START_WAIT_S = 30.0  # how long a start waits for its intent (the supervisor activates it)


@dataclass(frozen=True)
class ExampleOutcome:
    """What became of one example spec."""

    name: str
    source: Path
    state: str
    detail: str = ""
    has_chat: bool = False

    @property
    def takes_chat(self) -> bool:
        """A chat trigger on a live generation (a starting one holds the message until it runs)."""
        return self.has_chat and self.state in ("running", "starting")

    def describe(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.name}: {self.state}{detail}  [{self.source.name}]"


def secret_refs(spec: EmployeeSpec) -> list[str]:
    """Every secret the spec references, in order, once each."""
    return list(dict.fromkeys(u.ref for u in secret_uses(spec)))


def missing_secrets(spec: EmployeeSpec, store: SecretStore) -> list[str]:
    """The referenced secrets `store` cannot resolve for their use (missing, or declared for
    another purpose)."""
    missing: list[str] = []
    for use in secret_uses(spec):
        try:
            store.resolve(use.ref, use.purpose)
        except SecretUnavailable:
            missing.append(use.ref)
    return list(dict.fromkeys(missing))


@dataclass
class _Starting:
    """A spec applied and started: the start's intent, until it is waited on."""

    name: str
    source: Path
    has_chat: bool
    intent: dict[str, object]


def apply_one(
    client: OwnerClient, store: SecretStore, source: Path, doc: object
) -> ExampleOutcome | _Starting:
    """Apply one spec document and start it unless it already has a live generation; a start
    is waited on by the caller, so many employees start together."""
    try:
        spec = parse_spec(doc)
    except SpecInvalid as exc:
        return ExampleOutcome("?", source, "invalid", str(exc))
    missing = missing_secrets(spec, store)
    if missing:
        hint = "set EVENTOS_SECRET_<NAME>"
        if store.directory is not None:
            shown = os.path.relpath(store.directory)
            shown = str(store.directory) if shown.startswith("..") else shown
            hint += f" or add a file per secret to {shown}/"
        return ExampleOutcome(spec.name, source, "skipped", f"needs {', '.join(missing)}: {hint}")
    has_chat = any(t.kind == "chat" for t in spec.spec.triggers)
    try:
        client.apply(yaml.safe_dump(doc))
        current = client.get(spec.name)
        if current["state"] == "stopped":
            intent = client.lifecycle(spec.name, "start")["intent"]
            return _Starting(spec.name, source, has_chat, intent)
    except OwnerApiError as exc:
        return ExampleOutcome(spec.name, source, "refused", str(exc))
    return _outcome(spec.name, source, current, has_chat)


def _started(client: OwnerClient, starting: _Starting, deadline: float) -> ExampleOutcome:
    """The outcome once its start's intent was applied, or as it stands at the deadline (the
    supervisor activates a generation; past the deadline it shows `starting`)."""
    try:
        client.wait_intent(starting.intent, max(0.0, deadline - time.monotonic()))
        current = client.get(starting.name)
    except OwnerApiError as exc:
        return ExampleOutcome(starting.name, starting.source, "refused", str(exc))
    return _outcome(starting.name, starting.source, current, starting.has_chat)


def _outcome(name: str, source: Path, current: dict[str, object], has_chat: bool) -> ExampleOutcome:
    detail = f"generation {current['generation']}"
    return ExampleOutcome(name, source, str(current["state"]), detail, has_chat)


def apply_examples(folder: Path, url: str, token: str, store: SecretStore) -> list[ExampleOutcome]:
    """Apply and start every spec in `folder` that needs no unavailable secret: every start is
    asked for first, then waited on together (a thousand employees start in about the time
    the supervisors need, not one after another)."""
    if not folder.is_dir():
        return []
    results: list[ExampleOutcome | _Starting] = []
    with OwnerClient(url, token) as client:
        for source in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
            try:
                docs = [d for d in yaml.safe_load_all(source.read_text()) if d is not None]
            except yaml.YAMLError as exc:
                results.append(ExampleOutcome("?", source, "invalid", str(exc)))
                continue
            results += [apply_one(client, store, source, doc) for doc in docs]
        deadline = time.monotonic() + START_WAIT_S
        return [_started(client, r, deadline) if isinstance(r, _Starting) else r
                for r in results]  # fmt: skip
