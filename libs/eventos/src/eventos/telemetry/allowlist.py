"""What may leave an instance (SPEC §13): every attribute key a service exports, with its
type. The central collector's chart holds the same lists (deploy/helm/eventos-collector
values.yaml `allowlist`; a test keeps them equal): this is the first line of defence, the
collector's transform processor the second."""

from __future__ import annotations

import re
from collections.abc import Mapping

# Resource attributes (the global tags): an opaque instance id, the tier, the release.
RESOURCE_KEYS: dict[str, type] = {
    "service.name": str,
    "service.namespace": str,
    "service.version": str,
    "eventos.instance.id": str,
    "eventos.tier": str,
}
# Metric data point attributes: the services' label names (never employee, thread or content)
# and the Temporal SDK's, task_queue renamed `queue`.
DATAPOINT_KEYS: dict[str, type] = {
    key: str
    for key in (
        "source_kind", "outcome", "code", "status", "result", "reason", "llm_class", "queue",
        "activity_type", "poller_type", "worker_type",
        "gen_ai_provider_name", "gen_ai_token_type",
        "gen_ai.provider.name", "gen_ai.token.type", "gen_ai.operation.name",
    )
}  # fmt: skip
# Error report attributes: exception type, traceback frames, count; the body is empty. Events
# (an upgrade's outcome): their name and outcome, tokens of our own vocabulary.
LOG_KEYS: dict[str, type] = {
    "event.name": str,
    "outcome": str,
    "exception.type": str,
    "exception.stacktrace": str,
    "error.count": int,
    "code.function": str,
    "code.filepath": str,
    "code.lineno": int,
}
RENAMED = {"task_queue": "queue"}
# A label value is a token of our own vocabulary (a status, a queue, a class): never a sentence.
LABEL_VALUE = re.compile(r"[A-Za-z0-9_.:/+-]{1,80}")
NOT_A_TOKEN = "other"


def datapoint_attributes(labels: Mapping[str, str]) -> dict[str, str]:
    """The allowlisted labels of a sample, renamed; a value that is no token becomes `other`."""
    kept: dict[str, str] = {}
    for key, value in labels.items():
        key = RENAMED.get(key, key)
        if key in DATAPOINT_KEYS and value != "":  # Prometheus: an empty label is no label
            kept[key] = value if LABEL_VALUE.fullmatch(value) else NOT_A_TOKEN
    return kept


def violations(attrs: Mapping[str, object], allowed: Mapping[str, type]) -> list[str]:
    """Keys off the allowlist and values not of their declared type, as readable lines."""
    found = [f"{k!r} is not on the allowlist" for k in attrs if k not in allowed]
    found += [
        f"{k!r} is {type(v).__name__}, not {allowed[k].__name__}"
        for k, v in attrs.items()
        if k in allowed and type(v) is not allowed[k]
    ]
    return found
