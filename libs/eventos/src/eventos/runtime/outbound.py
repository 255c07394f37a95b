"""Outbound HTTP from inside the instance (the `http_request` tool, poll triggers): a request
may reach only public addresses unless the operator allows private ones.

A spec names hosts, and a model picks URLs among them; neither may turn a worker into a way
into the instance's own network (a cloud metadata address, the database, Temporal). Every
request, each redirect hop included, resolves its host and is refused when any address it
resolves to is not global (loopback, private, link-local, shared, reserved, multicast). The
connection then resolves again: a name that changes its answer between the two (DNS
rebinding) is a window this check narrows, not one it closes; an egress NetworkPolicy
closes it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import httpx

from eventos.settings import OutboundSettings

RESOLVE_TIMEOUT_S = 5.0


class OutboundRefused(httpx.TransportError):
    """The request would reach an address outside what the instance may call."""


async def check_host(host: str, port: int, settings: OutboundSettings) -> None:
    """OutboundRefused unless every address `host` resolves to is global."""
    if settings.allow_private:
        return
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
        addresses = [ip]
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as exc:
            raise OutboundRefused(f"could not resolve {host}: {exc}") from None
        addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
    for address in addresses:
        if not address.is_global:
            raise OutboundRefused(f"{host} is a private address ({address}); the operator does "
                                  "not allow those (EVENTOS_OUTBOUND_ALLOW_PRIVATE)")  # fmt: skip


class GuardedTransport(httpx.AsyncBaseTransport):
    """The default transport, after the address check of each request."""

    def __init__(self, settings: OutboundSettings) -> None:
        self.settings = settings
        self.inner = httpx.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        await check_host(url.host, url.port or (443 if url.scheme == "https" else 80),
                         self.settings)  # fmt: skip
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def client(settings: OutboundSettings, timeout: httpx.Timeout) -> httpx.AsyncClient:
    """A client for outbound calls: the address check, no proxies from the environment, no
    redirects followed on its own."""
    return httpx.AsyncClient(transport=GuardedTransport(settings), timeout=timeout,
                             trust_env=False, follow_redirects=False)  # fmt: skip
