"""The services' listening socket gives accepted connections TCP_NODELAY.

Without it a response written in two pieces (headers, body) waits for the client's delayed
ACK, adding ~40 ms to every answer.
"""

from __future__ import annotations

import asyncio
import socket

from eventos.runtime.service import bind


async def test_accepted_connections_have_tcp_nodelay() -> None:
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    listener = bind("127.0.0.1", 0)
    server = await asyncio.start_server(on_connect, sock=listener)
    port = listener.getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await asyncio.wait_for(accepted, 5) != 0
    finally:
        writer.close()
        server.close()
        await server.wait_closed()
