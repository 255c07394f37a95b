"""One DNS A query over UDP, enough to see CoreDNS answer through the kube-dns Service IP."""

from __future__ import annotations

import secrets
import socket
import struct


def query_a(server: str, name: str, timeout_s: float = 1.0) -> list[str]:
    """The IPv4 addresses `server` answers for `name` (empty on NXDOMAIN or no answer)."""
    ident = secrets.randbits(16)
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split("."))
    packet = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + b"\0\0\1\0\1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        sock.sendto(packet, (server, 53))
        reply = sock.recv(4096)
    return _addresses(reply, ident)


def _addresses(reply: bytes, ident: int) -> list[str]:
    got_id, flags, qdcount, ancount = struct.unpack("!HHHH", reply[:8])
    if got_id != ident or flags & 0x000F:
        return []
    offset = 12
    for _ in range(qdcount):
        offset = _skip_name(reply, offset) + 4
    found = []
    for _ in range(ancount):
        offset = _skip_name(reply, offset)
        rtype, _, _, length = struct.unpack("!HHIH", reply[offset : offset + 10])
        offset += 10
        if rtype == 1 and length == 4:
            found.append(socket.inet_ntoa(reply[offset : offset + 4]))
        offset += length
    return found


def _skip_name(data: bytes, offset: int) -> int:
    while data[offset]:
        if data[offset] & 0xC0 == 0xC0:
            return offset + 2
        offset += data[offset] + 1
    return offset + 1
