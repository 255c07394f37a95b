"""A real DNS server on loopback (UDP) whose answers the test scripts per name and per query,
and a resolver pointed at it (what the outbound guard resolves with in these tests): a name
may answer a public address first and a private one after, as a rebinding attacker's does."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dns.asyncresolver
import dns.exception
import dns.message
import dns.rdatatype
import dns.resolver
import dns.rrset


class DnsServer:
    """Answers A and AAAA queries from `script[name]`: the n-th question of a name and type
    gets the n-th list's addresses of that family (the last list repeats); `queries` counts
    the questions per `name/type`."""

    def __init__(self) -> None:
        self.script: dict[str, list[list[str]]] = {}
        self.queries: dict[str, int] = {}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def answer(self, name: str, *answers: list[str]) -> None:
        with self.lock:
            self.script[name.rstrip(".")] = list(answers)

    def _addresses(self, name: str, rdtype: str) -> list[str]:
        with self.lock:
            key = f"{name}/{rdtype}"
            n = self.queries.get(key, 0)
            self.queries[key] = n + 1
            answers = self.script.get(name, [[]])
            return answers[min(n, len(answers) - 1)]

    def serve(self) -> None:
        while True:
            try:
                wire, peer = self.sock.recvfrom(4096)
            except OSError:
                return  # closed
            if self.stopped.is_set():
                return
            try:
                query = dns.message.from_wire(wire)
            except dns.exception.DNSException:
                continue  # not a DNS message: no answer, as a server would
            question = query.question[0]
            reply = dns.message.make_response(query)
            family = socket.AF_INET6 if question.rdtype == dns.rdatatype.AAAA else socket.AF_INET
            name = question.name.to_text().rstrip(".")
            rdtype = dns.rdatatype.to_text(question.rdtype)
            found = [a for a in self._addresses(name, rdtype)
                     if (":" in a) == (family == socket.AF_INET6)]  # fmt: skip
            if found:
                reply.answer.append(dns.rrset.from_text_list(question.name, 0, "IN",
                                                             question.rdtype, found))  # fmt: skip
            self.sock.sendto(reply.to_wire(), peer)

    def resolver(self) -> dns.asyncresolver.Resolver:
        r = dns.asyncresolver.Resolver(configure=False)
        r.nameservers = ["127.0.0.1"]
        r.port = self.port
        r.cache = None
        return r


async def resolve_with(resolver: dns.asyncresolver.Resolver, host: str, port: int) -> list[str]:
    """Addresses of `host` from the resolver: its A answer, then its AAAA answer (one question
    of each kind: together they are one resolution)."""
    out: list[str] = []
    for rdtype in ("A", "AAAA"):
        try:
            answer = await resolver.resolve(host, rdtype, search=False)
        except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
            continue
        out += [r.to_text() for r in answer]
    if not out:
        raise OSError(f"{host}: no address")
    return out


@contextmanager
def dns_server() -> Iterator[DnsServer]:
    server = DnsServer()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        # Closing the socket does not wake a thread blocked in recvfrom (it waited out the
        # join's 5 s at every test's end): a datagram to itself does, once it is told to stop.
        server.stopped.set()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as waker:
            waker.sendto(b"", ("127.0.0.1", server.port))
        thread.join(timeout=5)
        server.sock.close()
