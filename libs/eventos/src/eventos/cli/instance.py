"""Which instance `eventosctl` talks to, and the errors its commands raise.

It finds the instance from, in order: `--url`/`--token`, `--stack FILE`,
EVENTOS_URL/EVENTOS_ADMIN_TOKEN, then the `.eventos/stack.json` that `make run` writes (looked
up from the working directory upwards).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eventos.client.owner_api import OwnerClient
from eventos.errors import EventOSError

STACK_FILE = Path(".eventos") / "stack.json"
START_HINT = "start one with `make run`"


class CliError(EventOSError):
    """The command failed."""


class UsageError(CliError):
    """The command was used wrongly (exit 2)."""


class Unreachable(CliError):
    """What the command needs does not answer (exit 5)."""


class NoInstance(Unreachable):
    """No instance is configured to talk to (exit 5, as an unreachable one)."""


def find_stack(start: Path) -> Path | None:
    """The nearest `.eventos/stack.json` in `start` or one of its parents."""
    for folder in [start, *start.parents]:
        if (folder / STACK_FILE).is_file():
            return folder / STACK_FILE
    return None


def load_stack(args: argparse.Namespace) -> dict[str, Any]:
    """The stack file named by --stack, else the nearest one; {} when there is none."""
    given: Path | None = getattr(args, "stack", None)
    path = given if given is not None else find_stack(Path.cwd())
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise NoInstance(f"no stack file at {path}; {START_HINT}") from None
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def _admin_token(found: dict[str, Any]) -> str | None:
    """The admin token of a source: the current content of the file a stack names (the token
    rotates there without a restart, docs/security.md), else the token it recorded."""
    path = found.get("admin_token_file")
    if isinstance(path, str) and path:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            text = ""
        if text:
            return text
    token = found.get("admin_token")
    return str(token) if token else None


def owner_client(args: argparse.Namespace) -> OwnerClient:
    """The owner API client: flags, then --stack, then environment, then the nearest stack."""
    url: str | None = getattr(args, "url", None)
    token: str | None = getattr(args, "token", None)
    sources: list[Callable[[], dict[str, Any]]] = []
    if getattr(args, "stack", None) is not None:
        sources.append(lambda: load_stack(args))
    env = os.environ
    sources.append(
        lambda: {
            "ingress_url": env.get("EVENTOS_URL"),
            "admin_token": env.get("EVENTOS_ADMIN_TOKEN"),
        }
    )
    sources.append(lambda: load_stack(args))
    for source in sources:
        if url and token:
            break
        found = source()
        url = url or found.get("ingress_url")
        token = token or _admin_token(found)
    if not url:
        raise NoInstance(
            f"no local instance found (no {STACK_FILE} here or above); {START_HINT}, "
            "or point --url / EVENTOS_URL at a running instance"
        )
    if not token:
        raise UsageError("no admin token: pass --token or set EVENTOS_ADMIN_TOKEN")
    return OwnerClient(str(url), str(token))
