"""What each secret is for (SPEC §17, "Secrets keep to their purpose"): the operator's map.

A secret reference in a spec is only a name; the operator who stores the secret also declares
its one purpose in `EVENTOS_SECRETS_PURPOSES` (the chart's `secrets.employees.purposes`):
whitespace- or comma-separated `<name>=<purpose>` entries, where `<name>` is a reference or a
prefix ending in `*` (`tg-*=channel`), an exact name winning over a prefix and a longer prefix
over a shorter one. Purposes: `llm` (a model endpoint's credential), `http:<host>` (the
`http_request` tool's credential for that host entry: `http:*.example.com` for a wildcard
entry, which is the explicit scope a wildcard needs), `poll:<host>` (a poll trigger's URL host),
`driver` (a gRPC driver's token), `channel` (a channel account's credential), `webhook` (a
webhook's verification secret). A name the map does not cover has no purpose and is refused
everywhere, except `driver-*`, the default reference of a driver's token, which is `driver`.

`apply` refuses a reference outside its purpose, naming the field; every use re-checks through
`SecretStore.resolve(ref, purpose)`, since the map may change after a spec is applied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from eventos import names
from eventos.errors import ConfigError, SecretUnavailable

VAR = "EVENTOS_SECRETS_PURPOSES"
LLM, DRIVER, CHANNEL, WEBHOOK = "llm", "driver", "channel", "webhook"
HTTP, POLL = "http", "poll"  # scoped: `http:<host>`, `poll:<host>`
HOST = r"(\*\.)?[a-z0-9]([a-z0-9-]{0,62}\.)*[a-z0-9-]{1,63}"
PURPOSE_RE = re.compile(rf"^({LLM}|{DRIVER}|{CHANNEL}|{WEBHOOK}|({HTTP}|{POLL}):{HOST})$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}\*?$")
KINDS = "purposes: llm, http:<host>, poll:<host>, driver, channel, webhook"
# Built in, below anything the operator declares: the default driver token reference.
DEFAULTS = {names.driver_token_ref("") + "*": DRIVER}


class SecretOutsidePurpose(SecretUnavailable):
    """The secret is declared for another purpose than this use."""


def http_purpose(host: str) -> str:
    """The purpose of a credential the `http_request` tool sends to this host entry."""
    return f"{HTTP}:{host.lower()}"


def poll_purpose(host: str) -> str:
    """The purpose of a credential a poll sends to this URL host."""
    return f"{POLL}:{host.lower().rstrip('.')}"


@dataclass(frozen=True)
class SecretPurposes:
    """The operator's map of secret names (or `prefix*`) to their one purpose."""

    declared: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, var: str = VAR) -> SecretPurposes:
        """From `name=purpose` entries; ConfigError naming the variable and the bad entry."""
        declared: dict[str, str] = {}
        for entry in text.replace(",", " ").split():
            name, eq, purpose = entry.partition("=")
            if not eq or not NAME_RE.match(name) or not PURPOSE_RE.match(purpose):
                raise ConfigError(f"{var}: {entry!r} is not <secret name>=<purpose> ({KINDS})")
            if declared.get(name, purpose) != purpose:
                raise ConfigError(f"{var}: {name!r} is given two purposes; a secret has one")
            declared[name] = purpose
        return cls(declared)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SecretPurposes:
        return cls.parse(env.get(VAR, ""))

    def of(self, ref: str) -> str | None:
        """The declared purpose of `ref`, or None when nothing declares one."""
        if ref in self.declared:
            return self.declared[ref]
        for table in (self.declared, DEFAULTS):
            prefixes = [n for n in table if n.endswith("*") and ref.startswith(n[:-1])]
            if prefixes:
                return table[max(prefixes, key=len)]
        return None

    def refusal(self, ref: str, purpose: str) -> str | None:
        """Why `ref` may not serve `purpose`, or None when it may."""
        declared = self.of(ref)
        if declared == purpose:
            return None
        if declared is None:
            return (f"secret {ref!r} has no declared purpose; it needs {purpose!r} "
                    f"(the operator declares purposes in {VAR})")  # fmt: skip
        return f"secret {ref!r} is declared for {declared!r}, not {purpose!r} ({VAR})"

    def check(self, ref: str, purpose: str) -> None:
        """SecretOutsidePurpose unless `ref` is declared for `purpose`."""
        why = self.refusal(ref, purpose)
        if why is not None:
            raise SecretOutsidePurpose(why)
