"""Reading the owner API's server-sent event streams in tests: a connection read in the
background, its blocks collected as they arrive, closed for real (the TCP connection drops)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from eventos.client.sse import Block, Parser
from eventos.testing import wait_for

Event = tuple[int, str, dict[str, Any]]  # place, kind, data


@dataclass
class Listening:
    """One open stream and what it has sent so far."""

    blocks: list[Block] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def events(self) -> list[Event]:
        return [(int(b.id or 0), b.event or "", json.loads(b.data))
                for b in self.blocks if b.data is not None]  # fmt: skip

    @property
    def last_id(self) -> int:
        """The place a client reconnecting now would send as Last-Event-ID."""
        return next(int(b.id) for b in reversed(self.blocks) if b.id is not None)

    async def until(self, what: str, check: Any, timeout: float = 30) -> list[Event]:
        """The events once `check(events)` holds."""

        async def holds() -> list[Event] | None:
            found = self.events()
            return found if check(found) else None

        return await wait_for(holds, timeout=timeout, what=what)

    async def close(self) -> None:
        """Drop the connection."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def listen(api: httpx.AsyncClient, path: str = "/v1/events", *, last: int | None = None,
                 **params: Any) -> Listening:  # fmt: skip
    """Open a stream (resuming after `last`); returns once it said where it starts."""
    heard = Listening()
    headers = {} if last is None else {"Last-Event-ID": str(last)}

    async def read() -> None:
        parser = Parser()
        timeout = httpx.Timeout(10, read=None)
        async with api.stream("GET", path, params=params, headers=headers, timeout=timeout) as r:
            assert r.status_code == 200, await r.aread()
            assert r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                heard.raw.append(line)
                block = parser.feed(line)
                if block is not None:
                    heard.blocks.append(block)

    heard.task = asyncio.create_task(read())

    async def started() -> bool:
        if heard.task is not None and heard.task.done():
            heard.task.result()  # its failure, raised here
        return bool(heard.blocks)

    await wait_for(started, timeout=15, what=f"{path} started")
    return heard


async def now_at(api: httpx.AsyncClient) -> int:
    """The place the operator stream is at now (a stream opened and closed)."""
    heard = await listen(api)
    await heard.close()
    return heard.last_id


def labels(events: list[Event], key: str = "attention") -> list[str]:
    """Each event as `<kind> <detail[key]>` (an attention item's kind tells it apart)."""
    return [f"{kind} {data['detail'].get(key)}" for _, kind, data in events]
