"""`http_request {method, url, headers?, body?}` → `{status, headers, body}` (SPEC §17).

Only hosts the agent's spec allows (`agents[].http_hosts`, exact or `*.domain`); a host entry
may attach a credential by secret reference (the model never sees or names a secret). `GET`
and `HEAD` are `read_only`; any other method is `unsafe` unless the call carries an
`Idempotency-Key` header (then `idempotent`). Redirects are not followed (the model reads the
3xx and its `Location`); proxies from the environment are not used; the response is read up
to a cap and the model sees its first bytes. A call that could not connect sent nothing, so it
goes back to the model as a refusal; one that broke off later is retried (safe calls) or ends
`unknown` (unsafe calls, by the runner).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import httpx

from eventos.runtime.outbound import OutboundRefused, client
from eventos.secret_purposes import http_purpose
from eventos.settings import HttpToolSettings, OutboundSettings
from eventos.spec.model import HttpHost
from eventos.tools.base import Effect, Tool, ToolContext, ToolMisconfigured, ToolRefused, obj

SETTINGS_KEY = "http"
OUTBOUND_KEY = "outbound"
RESOLVER_KEY = "resolver"  # an outbound.Resolver in place of the system's (tests' own DNS)
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
SAFE_METHODS = ("GET", "HEAD")
IDEMPOTENCY_HEADER = "idempotency-key"
# Response headers the model reads back (the rest is noise or cookies).
SHOWN_HEADERS = ("content-type", "content-length", "location", "retry-after", "etag",
                 "last-modified", IDEMPOTENCY_HEADER)  # fmt: skip
# Request headers the tool owns: the model may not set them.
RESERVED_HEADERS = ("host", "content-length", "transfer-encoding", "connection", "authorization",
                    "cookie", "proxy-authorization")  # fmt: skip

PARAMETERS = obj({
    "method": {"type": "string", "enum": list(METHODS)},
    "url": {"type": "string", "maxLength": 2048},
    "headers": {"type": "object", "maxProperties": 32,
                "additionalProperties": {"type": "string", "maxLength": 1024}},
    "body": {"description": "text, or a JSON value sent as application/json"},
}, ["method", "url"])  # fmt: skip


def effect(args: dict[str, Any]) -> Effect:
    """GET/HEAD read only; others unsafe, idempotent when they carry an Idempotency-Key."""
    if str(args.get("method", "")).upper() in SAFE_METHODS:
        return Effect.READ_ONLY
    headers = {k.lower() for k in (args.get("headers") or {})}
    return Effect.IDEMPOTENT if IDEMPOTENCY_HEADER in headers else Effect.UNSAFE


def host_allowed(hosts: list[HttpHost], host: str) -> HttpHost | None:
    """The agent's entry for `host`: an exact name, or `*.domain` for its subdomains."""
    host = host.lower().rstrip(".")
    for entry in hosts:
        name = entry.host.lower()
        if name == host or (name.startswith("*.") and host.endswith(name[1:])):
            return entry
    return None


def _request_headers(ctx: ToolContext, entry: HttpHost, given: dict[str, str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in given.items():
        if name.lower() in RESERVED_HEADERS:
            raise ToolRefused(f"header {name!r} is set by the tool, not by the call")
        if any(c in name + value for c in "\r\n\0"):
            raise ToolRefused(f"header {name!r} holds a line break or NUL")
        headers[name] = value
    if entry.auth is not None:
        try:
            secret = ctx.secrets.resolve(entry.auth.secret, http_purpose(entry.host)).decode()
        except Exception as exc:  # SecretUnavailable, or bytes that are not text
            raise ToolMisconfigured(f"credential of host {entry.host}: {exc}") from None
        if entry.auth.scheme == "bearer":
            headers["Authorization"] = f"Bearer {secret}"
        else:
            headers[str(entry.auth.header)] = secret
    return headers


async def _read(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > cap:
            return bytes(body[:cap]), True
    return bytes(body), False


async def http_request(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    settings: HttpToolSettings = ctx.extras.get(SETTINGS_KEY) or HttpToolSettings()
    outbound: OutboundSettings = ctx.extras.get(OUTBOUND_KEY) or OutboundSettings()
    method, url = str(args["method"]).upper(), str(args["url"])
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolRefused("url must be an absolute http or https URL")
    if parts.username or parts.password:
        raise ToolRefused("url must not carry credentials")
    entry = host_allowed(ctx.agent.http_hosts, parts.hostname)
    if entry is None:
        allowed = ", ".join(h.host for h in ctx.agent.http_hosts) or "none"
        raise ToolRefused(f"host {parts.hostname!r} is not allowed (allowed: {allowed})")
    headers = _request_headers(ctx, entry, dict(args.get("headers") or {}))
    content: bytes | None = None
    if "body" in args and args["body"] is not None:
        if isinstance(args["body"], str):
            content = args["body"].encode()
        else:
            content = json.dumps(args["body"]).encode()
            headers.setdefault("Content-Type", "application/json")
    timeout = httpx.Timeout(settings.timeout_s)
    try:
        async with (
            client(outbound, timeout, ctx.extras.get(RESOLVER_KEY)) as http,
            asyncio.timeout(settings.timeout_s * 2),
            http.stream(method, url, headers=headers, content=content) as response,
        ):
            body, cut = await _read(response, settings.max_response_bytes)
    except OutboundRefused as exc:
        raise ToolRefused(f"{exc}; nothing was sent") from None
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise ToolRefused(
            f"could not connect to {parts.hostname}: {exc}; nothing was sent"
        ) from None
    except httpx.UnsupportedProtocol as exc:
        raise ToolRefused(str(exc)) from None
    text = body[: settings.max_body_shown].decode(errors="replace")
    out: dict[str, Any] = {
        "status": response.status_code,
        "headers": {k: v for k, v in response.headers.items() if k.lower() in SHOWN_HEADERS},
        "body": text,
    }
    if cut or len(body) > settings.max_body_shown:
        out["truncated"] = True
    return out


TOOLS = [
    Tool(
        name="http_request",
        description=(
            "Make an HTTP request to a host this agent is allowed to reach. GET and HEAD may be "
            "repeated safely; other methods run at most once unless you send an Idempotency-Key "
            "header. Returns the status, a few headers and the start of the body."
        ),
        parameters=PARAMETERS,
        run=http_request,
        effect=effect,
    ),
]
