"""Every secret reference of a spec with its field path and the purpose that use needs
(eventos.secret_purposes): what `apply` checks against the operator's map."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from eventos import secret_purposes as purposes
from eventos.secret_purposes import SecretPurposes
from eventos.spec.model import CHANNEL_KINDS, EmployeeSpec


@dataclass(frozen=True)
class SecretUse:
    path: str  # the field, as SpecInvalid names it
    ref: str
    purpose: str


def secret_uses(spec: EmployeeSpec) -> list[SecretUse]:
    """Each reference in the order of the spec (a grpc trigger's default token included)."""
    uses: list[SecretUse] = []
    for i, agent in enumerate(spec.spec.agents):
        if agent.model.credential:
            uses.append(SecretUse(f"spec.agents[{i}].model.credential", agent.model.credential,
                                  purposes.LLM))  # fmt: skip
        for j, entry in enumerate(agent.http_hosts):
            if entry.auth is not None:
                uses.append(SecretUse(f"spec.agents[{i}].http_hosts[{j}].auth", entry.auth.secret,
                                      purposes.http_purpose(entry.host)))  # fmt: skip
    for i, t in enumerate(spec.spec.triggers):
        at = f"spec.triggers[{i}]"
        if t.verify is not None and t.verify.secret:
            uses.append(SecretUse(f"{at}.verify.secret", t.verify.secret, purposes.WEBHOOK))
        if t.kind in CHANNEL_KINDS and t.account:
            uses.append(SecretUse(f"{at}.account", t.account, purposes.CHANNEL))
        if t.token_ref is not None:
            uses.append(SecretUse(f"{at}.token", t.token_ref, purposes.DRIVER))
        if t.auth is not None and t.url is not None:
            host = urlsplit(t.url).hostname or ""
            uses.append(SecretUse(f"{at}.auth", t.auth.secret, purposes.poll_purpose(host)))
    return uses


def purpose_errors(spec: EmployeeSpec, declared: SecretPurposes) -> list[tuple[str, str]]:
    """(field path, why) for each reference outside the purpose its operator declared."""
    return [(u.path, why) for u in secret_uses(spec)
            if (why := declared.refusal(u.ref, u.purpose)) is not None]  # fmt: skip
