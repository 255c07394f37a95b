"""A TCP relay for tests: a port of the test's own in front of a real server (PostgreSQL), so a
test can make the server answer late or cut a client's first connections."""

from __future__ import annotations

import asyncio
import contextlib


async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until it ends or drops, then close the other side."""
    try:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
    finally:
        writer.close()


async def relay(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
) -> None:
    """Join a client's connection to `host`:`port`, both ways."""
    up_reader, up_writer = await asyncio.open_connection(host, port)
    await asyncio.gather(forward(reader, up_writer), forward(up_reader, writer))
