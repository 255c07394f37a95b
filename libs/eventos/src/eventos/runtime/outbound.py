"""Outbound HTTP from inside the instance (the `http_request` tool, poll triggers): a request
may reach only public addresses unless the operator allows private ones.

A spec names hosts, and a model picks URLs among them; neither may turn a worker into a way
into the instance's own network (a cloud metadata address, the database, Temporal). Each new
connection resolves its host once, is refused when any address of the answer is not global
(loopback, private, link-local, shared, reserved, multicast — an address embedding an IPv4
one is judged by that IPv4), and then connects to an address of that same answer. The URL is
unchanged, so the Host header, TLS SNI and certificate verification still use the name: a
name that answers a public address to the check and a private one to the connection (DNS
rebinding) has no second answer to give. The chart's egress NetworkPolicy is the second wall.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable

import httpcore
import httpx

from eventos.settings import OutboundSettings

RESOLVE_TIMEOUT_S = 5.0

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host, port) → the addresses a connection may use, in order (an injectable DNS resolver).
Resolver = Callable[[str, int], Awaitable[list[str]]]

# IPv6 forms that carry an IPv4 address a gateway or tunnel delivers to (RFC 6052 NAT64, its
# local-use prefix of RFC 8215, RFC 4291 IPv4-compatible, RFC 3056 6to4; IPv4-mapped is
# ipaddress's own `ipv4_mapped`).
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


class OutboundRefused(httpx.TransportError):
    """The request would reach an address outside what the instance may call."""


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, compatible, NAT64, 6to4), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    raw = address.packed
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64:
        return ipaddress.IPv4Address(raw[12:])
    if address in NAT64_LOCAL:  # RFC 6052 /48 layout: bits 64-71 are the zero u-octet
        return ipaddress.IPv4Address(raw[6:8] + raw[9:11])
    if address in IPV4_COMPATIBLE and int(address) > 1:  # not :: nor ::1 (judged as IPv6)
        return ipaddress.IPv4Address(raw[12:])
    return None


def is_public(address: IPAddress) -> bool:
    """Global, and so is any IPv4 address it embeds."""
    inner = embedded_ipv4(address)
    if inner is not None:
        return inner.is_global
    return address.is_global


async def system_resolve(host: str, port: int) -> list[str]:
    """The system resolver's addresses for `host` (getaddrinfo), in its order."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def checked_addresses(host: str, port: int, resolver: Resolver,
                            timeout_s: float = RESOLVE_TIMEOUT_S,
                            allow_private: bool = False) -> list[IPAddress]:  # fmt: skip
    """One resolution of `host`; OutboundRefused unless every address of it is public (or the
    operator allows private ones)."""
    try:
        addresses: list[IPAddress] = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        try:
            async with asyncio.timeout(timeout_s):
                answer = await resolver(host, port)
            addresses = [ipaddress.ip_address(a.partition("%")[0]) for a in answer]
        except (OSError, TimeoutError, ValueError) as exc:
            raise OutboundRefused(f"could not resolve {host}: {exc}") from None
    if not addresses:
        raise OutboundRefused(f"could not resolve {host}: no address")
    for address in addresses:
        if not (allow_private or is_public(address)):
            raise OutboundRefused(f"{host} is a private address ({address}); the operator does "
                                  "not allow those (EVENTOS_OUTBOUND_ALLOW_PRIVATE)")  # fmt: skip
    return addresses


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to the addresses its one resolution
    checked (TLS is started on the stream afterwards with the original name as SNI)."""

    def __init__(self, resolver: Resolver, allow_private: bool = False) -> None:
        self.resolver = resolver
        self.allow_private = allow_private
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        resolve_s = min(timeout or RESOLVE_TIMEOUT_S, RESOLVE_TIMEOUT_S)
        addresses = await checked_addresses(host, port, self.resolver, resolve_s,
                                            self.allow_private)  # fmt: skip
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(str(address), port, timeout, local_address,
                                                    socket_options)  # fmt: skip
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise OutboundRefused("outbound calls do not use unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def transport(settings: OutboundSettings,
              resolver: Resolver | None = None) -> httpx.AsyncHTTPTransport:  # fmt: skip
    """httpx's transport with its pool connecting through the GuardedBackend (httpx takes no
    backend argument, so the pool is rebuilt with it; TLS as httpx's defaults, plus the
    operator's CA file when set)."""
    guarded = httpx.AsyncHTTPTransport(trust_env=False)
    tls = httpx.create_ssl_context(trust_env=False)
    if settings.ca_file is not None:
        tls.load_verify_locations(cafile=settings.ca_file)
    guarded._pool = httpcore.AsyncConnectionPool(
        ssl_context=tls,
        network_backend=GuardedBackend(resolver or system_resolve, settings.allow_private),
    )
    return guarded


def client(settings: OutboundSettings, timeout: httpx.Timeout,
           resolver: Resolver | None = None) -> httpx.AsyncClient:  # fmt: skip
    """A client for outbound calls: the address check on each connection, no proxies from the
    environment, no redirects followed on its own."""
    return httpx.AsyncClient(transport=transport(settings, resolver), timeout=timeout,
                             trust_env=False, follow_redirects=False)  # fmt: skip
