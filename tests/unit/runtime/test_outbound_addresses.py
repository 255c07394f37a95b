"""Which addresses the outbound guard counts as public: an IPv6 address that carries an IPv4
one (IPv4-mapped, IPv4-compatible, NAT64 and its local-use prefix, 6to4) is judged by it; the
operator's CA file must exist."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from eventos.errors import ConfigError
from eventos.runtime.outbound import OutboundRefused, checked_addresses, embedded_ipv4, is_public
from eventos.settings import OutboundSettings


@pytest.mark.parametrize(
    ("address", "inner"),
    [
        ("::ffff:127.0.0.1", "127.0.0.1"),  # IPv4-mapped
        ("::ffff:8.8.8.8", "8.8.8.8"),
        ("::127.0.0.1", "127.0.0.1"),  # IPv4-compatible
        ("::10.0.0.1", "10.0.0.1"),
        ("::8.8.8.8", "8.8.8.8"),
        ("64:ff9b::7f00:1", "127.0.0.1"),  # NAT64 (RFC 6052)
        ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
        ("64:ff9b::808:808", "8.8.8.8"),
        ("64:ff9b:1:7f00:0:100::", "127.0.0.1"),  # local-use NAT64 (RFC 8215), /48 layout
        ("64:ff9b:1:a00:0:100::", "10.0.0.1"),
        ("2002:7f00:1::", "127.0.0.1"),  # 6to4
        ("2002:a9fe:a9fe::1", "169.254.169.254"),
        ("2002:808:808::1", "8.8.8.8"),
    ],
)
def test_an_embedded_ipv4_is_found(address: str, inner: str) -> None:
    ip = ipaddress.ip_address(address)
    assert embedded_ipv4(ip) == ipaddress.ip_address(inner)
    assert is_public(ip) == ipaddress.ip_address(inner).is_global


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("2606:4700::1111", True),
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("8.8.8.8", True),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("10.1.2.3", False),
    ],
)
def test_plain_addresses_keep_their_own_verdict(address: str, public: bool) -> None:
    ip = ipaddress.ip_address(address)
    assert embedded_ipv4(ip) is None
    assert is_public(ip) is public


async def test_every_address_of_an_answer_is_checked() -> None:
    async def mixed(host: str, port: int) -> list[str]:
        return ["8.8.8.8", "64:ff9b::a00:1"]

    with pytest.raises(OutboundRefused, match=r"private address \(64:ff9b::a00:1\)"):
        await checked_addresses("mixed.test", 443, mixed)
    assert await checked_addresses("mixed.test", 443, mixed, allow_private=True)


def test_the_ca_file_setting_names_a_file_that_exists(tmp_path: Path) -> None:
    assert OutboundSettings.from_env({}).ca_file is None
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    assert OutboundSettings.from_env({"EVENTOS_OUTBOUND_CA_FILE": str(bundle)}).ca_file == str(
        bundle
    )
    with pytest.raises(ConfigError, match="no such file"):
        OutboundSettings.from_env({"EVENTOS_OUTBOUND_CA_FILE": str(tmp_path / "missing.pem")})
