"""The employees in `examples/` that `make run` applies and starts (SPEC §17 Local instance).

A spec is skipped when a secret it references (model credential, webhook secret, channel
account) cannot be resolved the way the services would resolve it: from EVENTOS_SECRET_<NAME>
or a file in the secrets directory. So a fresh checkout starts only what needs no credentials,
and dropping `openai-main` into `.eventos/secrets/` is enough to bring the next one up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from eventos.errors import SecretUnavailable, SpecInvalid
from eventos.owner_client import OwnerApiError, OwnerClient
from eventos.settings import SecretStore
from eventos.spec import CHANNEL_KINDS, EmployeeSpec, parse_spec

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
    refs: list[str] = [a.model.credential for a in spec.spec.agents if a.model.credential]
    for t in spec.spec.triggers:
        if t.verify is not None and t.verify.secret:
            refs.append(t.verify.secret)
        if t.kind in CHANNEL_KINDS and t.account:
            refs.append(t.account)
    return list(dict.fromkeys(refs))


def missing_secrets(spec: EmployeeSpec, store: SecretStore) -> list[str]:
    """The referenced secrets `store` cannot resolve."""
    missing: list[str] = []
    for ref in secret_refs(spec):
        try:
            store.resolve(ref)
        except SecretUnavailable:
            missing.append(ref)
    return missing


def apply_one(client: OwnerClient, store: SecretStore, source: Path, doc: object) -> ExampleOutcome:
    """Apply one spec document and start it unless it already has a live generation."""
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
            started = client.lifecycle(spec.name, "start")
            # The supervisor activates the generation; past the deadline it shows `starting`.
            client.wait_intent(started["intent"], START_WAIT_S)
            current = client.get(spec.name)
    except OwnerApiError as exc:
        return ExampleOutcome(spec.name, source, "refused", str(exc))
    detail = f"generation {current['generation']}"
    return ExampleOutcome(spec.name, source, str(current["state"]), detail, has_chat)


def apply_examples(folder: Path, url: str, token: str, store: SecretStore) -> list[ExampleOutcome]:
    """Apply and start every spec in `folder` that needs no unavailable secret."""
    if not folder.is_dir():
        return []
    client = OwnerClient(url, token)
    outcomes: list[ExampleOutcome] = []
    for source in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        try:
            docs = [d for d in yaml.safe_load_all(source.read_text()) if d is not None]
        except yaml.YAMLError as exc:
            outcomes.append(ExampleOutcome("?", source, "invalid", str(exc)))
            continue
        outcomes += [apply_one(client, store, source, doc) for doc in docs]
    return outcomes
