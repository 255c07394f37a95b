"""The outbound guard over TLS, on a real HTTPS server on loopback behind a real DNS server: the
connection goes to the checked address, and TLS still speaks to the name (SNI) and verifies the
certificate against the name, not the address, with the operator's CA file trusted."""

from __future__ import annotations

import datetime
import functools
import json
import ssl
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import apply_and_start
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from dns_server import DnsServer, dns_server, resolve_with
from loopback_http import http_employee
from psycopg_pool import AsyncConnectionPool
from test_tools import call

from eventos import names
from eventos.db import Conn
from eventos.settings import HttpToolSettings, OutboundSettings, SecretStore
from eventos.tools import http
from eventos.tools.runner import ToolRunner

SETTINGS = HttpToolSettings(timeout_s=5, max_response_bytes=64 * 1024, max_body_shown=1024)
NAME = "orders.test"


def _certificate(subject: str, issuer: x509.Name, issuer_key: Any, key: Any, *, ca: bool,
                 dns_names: list[str]) -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if dns_names:
        alt = x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names])
        builder = builder.add_extension(alt, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@dataclass
class Tls:
    """A CA's PEM file and, for a name, the server's certificate chain and key files."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def issue(tmp_path: Path, server_name: str) -> Tls:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "eventos-test-ca")])
    ca = _certificate("eventos-test-ca", ca_name, ca_key, ca_key, ca=True, dns_names=[])
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _certificate(server_name, ca_name, ca_key, key, ca=False, dns_names=[server_name])
    tls = Tls(tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key")
    tls.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    tls.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))  # fmt: skip
    return tls


@dataclass
class HttpsServer:
    """A real HTTPS server on 127.0.0.1 recording the SNI and the Host of each request."""

    server: ThreadingHTTPServer
    sni: list[str | None] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


@contextmanager
def https_server(tls: Tls) -> Iterator[HttpsServer]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    record = HttpsServer(ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler))

    def on_sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        record.sni.append(name)

    context.sni_callback = on_sni  # type: ignore[assignment]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            record.hosts.append(self.headers.get("Host", ""))
            body = b'{"orders": 3}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    record.server.RequestHandlerClass = Handler
    record.server.socket = context.wrap_socket(record.server.socket, server_side=True)
    record.server.daemon_threads = True
    thread = threading.Thread(target=record.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield record
    finally:
        record.server.shutdown()
        record.server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def dns() -> Iterator[DnsServer]:
    with dns_server() as d:
        yield d


@pytest.fixture
async def employee(pool: AsyncConnectionPool[Conn]) -> str:
    name = f"t{uuid.uuid4().hex[:8]}"
    await apply_and_start(pool, http_employee(name, f"[{NAME}]"))
    return name


def runner(pool: AsyncConnectionPool[Conn], dns: DnsServer, ca_file: Path | None) -> ToolRunner:
    outbound = OutboundSettings(
        allow_private=True, ca_file=None if ca_file is None else str(ca_file)
    )
    resolver = functools.partial(resolve_with, dns.resolver())
    extras = {http.SETTINGS_KEY: SETTINGS, http.OUTBOUND_KEY: outbound, http.RESOLVER_KEY: resolver}
    return ToolRunner(pool, SecretStore(env={}), extras)


async def test_tls_speaks_to_the_name_on_the_checked_address(
    pool: AsyncConnectionPool[Conn], employee: str, dns: DnsServer, tmp_path: Path
) -> None:
    tls = issue(tmp_path, NAME)
    dns.answer(NAME, ["127.0.0.1"])
    with https_server(tls) as server:
        url = f"https://{NAME}:{server.port}/orders"
        c = call(employee, {"method": "GET", "url": url})
        result = await runner(pool, dns, tls.ca_file).run(c)
        assert result.outcome == names.TOOL_OK, result.content
        assert json.loads(result.content)["status"] == 200
        assert server.sni == [NAME]  # SNI names the host, though the socket went to the address
        assert server.hosts == [f"{NAME}:{server.port}"]
        assert dns.queries[f"{NAME}/A"] == 1


async def test_a_certificate_for_another_name_is_refused(
    pool: AsyncConnectionPool[Conn], employee: str, dns: DnsServer, tmp_path: Path
) -> None:
    tls = issue(tmp_path, "elsewhere.test")  # trusted CA, wrong name: verified against the name
    dns.answer(NAME, ["127.0.0.1"])
    with https_server(tls) as server:
        c = call(employee, {"method": "GET", "url": f"https://{NAME}:{server.port}/orders"})
        result = await runner(pool, dns, tls.ca_file).run(c)
        assert result.outcome != names.TOOL_OK, result.content
        assert server.hosts == []


async def test_without_the_operators_ca_the_certificate_is_untrusted(
    pool: AsyncConnectionPool[Conn], employee: str, dns: DnsServer, tmp_path: Path
) -> None:
    tls = issue(tmp_path, NAME)
    dns.answer(NAME, ["127.0.0.1"])
    with https_server(tls) as server:
        c = call(employee, {"method": "GET", "url": f"https://{NAME}:{server.port}/orders"})
        result = await runner(pool, dns, None).run(c)
        assert result.outcome != names.TOOL_OK, result.content
        assert server.hosts == []
