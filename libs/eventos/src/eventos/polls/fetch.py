"""One bounded fetch of a poll trigger's endpoint, and the page read from its JSON.

Bounded (I3): connect and read timeouts, a deadline over the whole exchange (a server trickling
bytes cannot hold an attempt), a response cap read as a stream (reading stops past it), proxies
from the environment ignored, redirects followed only to the same origin.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from eventos import failures, names
from eventos import secret_purposes as purposes
from eventos.errors import PollFailed, SecretUnavailable
from eventos.runtime.outbound import OutboundRefused, Resolver, client
from eventos.settings import OutboundSettings, SecretStore
from eventos.spec.model import Trigger

TIMEOUT = httpx.Timeout(connect=5.0, read=15.0, write=10.0, pool=5.0)
DEADLINE_S = 30.0  # the whole exchange, redirects included
MAX_REDIRECTS = 3
ERROR_MAX_CHARS = 500


@dataclass(frozen=True)
class Page:
    """What one fetch read: the items in order and the next cursor (None: keep the current)."""

    items: list[Any]
    cursor: str | None


def http_client(outbound: OutboundSettings, resolver: Resolver | None = None) -> httpx.AsyncClient:
    """The client polls share: public addresses only unless the operator allows private ones
    (each connection to an address its one resolution checked), no proxies from the
    environment, no automatic redirects (each hop is checked)."""
    return client(outbound, TIMEOUT, resolver)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname or "", parts.port


def request_headers(trigger: Trigger, secrets: SecretStore) -> dict[str, str]:
    """Accept JSON; the credential resolved from its secret reference at each attempt."""
    headers = {"Accept": "application/json"}
    if trigger.auth is not None:
        try:
            assert trigger.url is not None  # a poll trigger has one (the spec checks)
            host = urlsplit(trigger.url).hostname or ""
            value = secrets.resolve(trigger.auth.secret, purposes.poll_purpose(host)).decode()
        except SecretUnavailable as exc:
            raise PollFailed(str(exc), category=failures.AUTH) from exc
        if trigger.auth.scheme == "bearer":
            headers["Authorization"] = f"Bearer {value}"
        else:
            headers[str(trigger.auth.header)] = value
    return headers


async def _read_capped(response: httpx.Response, cap: int) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > cap:
            raise PollFailed(f"response over {cap} bytes")
    return bytes(body)


async def _exchange(http: httpx.AsyncClient, url: str, headers: dict[str, str],
                    cap: int) -> bytes:  # fmt: skip
    origin = _origin(url)
    for _ in range(MAX_REDIRECTS + 1):
        async with http.stream("GET", url, headers=headers) as response:
            if response.is_redirect:
                target = urljoin(url, response.headers.get("location", ""))
                if _origin(target) != origin:
                    raise PollFailed(f"HTTP {response.status_code}: redirect to another origin")
                url = target  # the target's query stands as given
                continue
            if response.status_code == httpx.codes.TOO_MANY_REQUESTS:
                wait = response.headers.get("retry-after", "")
                raise PollFailed("HTTP 429", float(wait) if wait.isdigit() else None,
                                 category=failures.RATE)  # fmt: skip
            if not response.is_success:
                code = response.status_code
                raise PollFailed(f"HTTP {code}", category=failures.status_category(code))
            return await _read_capped(response, cap)
    raise PollFailed(f"more than {MAX_REDIRECTS} redirects")


async def fetch(
    http: httpx.AsyncClient,
    trigger: Trigger,
    cursor: str | None,
    secrets: SecretStore,
    cap: int = names.POLL_RESPONSE_MAX_BYTES,
) -> bytes:
    """The endpoint's body for `cursor` (the first poll sends none), or PollFailed."""
    url = httpx.URL(str(trigger.url))
    if cursor is not None and trigger.cursor_param:  # the URL's own query parameters stay
        url = url.copy_set_param(trigger.cursor_param, cursor)
    headers = request_headers(trigger, secrets)
    try:
        async with asyncio.timeout(DEADLINE_S):
            return await _exchange(http, str(url), headers, cap)
    except TimeoutError:
        raise PollFailed(f"no complete answer within {DEADLINE_S:.0f} s",
                         category=failures.TIMEOUT) from None  # fmt: skip
    except httpx.HTTPError as exc:
        # No answer (refused, reset, timed out) is the endpoint's outage or time-out; the
        # outbound guard's refusal is the trigger's (its URL names an address not allowed).
        category = failures.TIMEOUT if isinstance(exc, httpx.TimeoutException) else failures.OUTAGE
        if isinstance(exc, OutboundRefused):
            category = failures.INVALID_REQUEST
        raise PollFailed(f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS],
                         category=category) from exc  # fmt: skip


def at_path(doc: Any, path: str) -> Any:
    """The value at a dotted path (a numeric segment indexes a list); KeyError when absent."""
    for segment in path.split("."):
        if isinstance(doc, dict) and segment in doc:
            doc = doc[segment]
        elif isinstance(doc, list) and segment.isdigit() and int(segment) < len(doc):
            doc = doc[int(segment)]
        else:
            raise KeyError(segment)
    return doc


def parse_page(body: bytes, trigger: Trigger) -> Page:
    """The items at `items_path` and the cursor at `cursor_path` (absent or null: none)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise PollFailed(f"the response is not JSON: {exc}"[:ERROR_MAX_CHARS]) from None
    try:
        items = at_path(doc, str(trigger.items_path))
    except KeyError:
        raise PollFailed(f"no {trigger.items_path!r} in the response") from None
    if not isinstance(items, list):
        raise PollFailed(f"{trigger.items_path!r} is {type(items).__name__}, not a list")
    cursor: Any = None
    if trigger.cursor_path:
        try:
            cursor = at_path(doc, trigger.cursor_path)
        except KeyError:
            cursor = None  # the last page often leaves it out: poll the same cursor again
    if cursor is not None and (isinstance(cursor, bool) or not isinstance(cursor, str | int)):
        raise PollFailed(f"{trigger.cursor_path!r} is {type(cursor).__name__}, not a cursor")
    return Page(items, None if cursor is None else str(cursor))


def item_id(item: Any, trigger: Trigger, index: int) -> str:
    """An item's dedupe id: the value at `id_path`, else the sha256 of its canonical JSON."""
    if trigger.id_path is None:
        canonical = json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    try:
        value = at_path(item, trigger.id_path)
    except KeyError:
        raise PollFailed(f"item {index} has no {trigger.id_path!r}") from None
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise PollFailed(f"item {index}: {trigger.id_path!r} is not a string or an integer")
    return str(value)
