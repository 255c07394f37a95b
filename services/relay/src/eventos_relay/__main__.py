"""`python -m eventos_relay`: deliver streams to their entities (and, later, owner intents)."""

from __future__ import annotations

import asyncio
import os
import socket

from eventos.relay import Relay, relay_loop
from eventos.service import configure_logging
from eventos.wiring import ConnectedConfig, build_connected


async def main() -> None:
    cfg = ConnectedConfig.from_env("relay", wake=True)
    service, connected = await build_connected(cfg)
    relay_id = os.environ.get("EVENTOS_RELAY_ID") or f"{socket.gethostname()}:{os.getpid()}"
    relay = Relay(connected.pool, connected.temporal, relay_id)
    service.loops.append(lambda: relay_loop(relay, connected.signal, cfg.service.poll_interval_s))
    await service.run()


if __name__ == "__main__":
    configure_logging()
    asyncio.run(main())
