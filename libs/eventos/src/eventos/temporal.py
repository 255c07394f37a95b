"""The Temporal connection every Temporal-facing service holds, connected lazily.

A service starts and serves /livez while Temporal is down; /readyz reports it until the
client connects (SPEC I2: no request path waits on Temporal). The client's data converter
refuses payloads over 64 KB (I7; eventos.payload_guard).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio.client import Client

from eventos.payload_guard import connect
from eventos.settings import TemporalSettings


@dataclass
class TemporalConnection:
    """A client that is (re)made on demand."""

    settings: TemporalSettings
    client: Client | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def get(self) -> Client:
        async with self._lock:
            if self.client is None:
                self.client = await connect(self.settings.address, self.settings.namespace)
            return self.client

    async def ready(self) -> None:
        """Raise unless the frontend answers a health check."""
        client = await self.get()
        ok = await client.service_client.check_health()
        if not ok:
            raise RuntimeError("Temporal frontend is not serving")
