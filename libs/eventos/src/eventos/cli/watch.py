"""`--watch` and `--follow`: reading the operator event stream (`GET /v1/events`,
docs/events.md) across dropped connections.

`start` opens the stream before the command lists what it watches (the stream first says its
place), so a change between the list and the stream is not missed: at worst it is shown twice,
as the list and as the change. `blocks` goes on reading it; when the connection drops (an
ingress restart, a proxy's timeout, 45 silent seconds) it connects again with the last place
it read as Last-Event-ID, after 0.5, 1, 2, then every 5 seconds, saying so on stderr (an
answer 5xx, the database away, is retried too): the stream then sends every event after that
place, once. A refusal (401, 403, 410: the place is past the retention) ends the watch.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from eventos.client.owner_api import InstanceUnreachable, OwnerApiError, OwnerClient, StreamDropped
from eventos.client.sse import Block

EVENTS_PATH = "/v1/events"
RECONNECT_S = (0.5, 1.0, 2.0, 5.0)


def on_block() -> None:
    """Called after each block is handled, the stream's first (its place) once the command
    printed what it lists (a seam: tests act and end a watch here)."""


def pause(seconds: float) -> None:
    time.sleep(seconds)


@dataclass
class Stream:
    """An operator stream being watched: its filters, the last place read, its connection."""

    client: OwnerClient
    params: dict[str, str]
    last: str | None
    open: Iterator[Block]


def start(client: OwnerClient, params: dict[str, str]) -> Stream:
    """Open the stream from now; returns once it said its place (refusals raise here)."""
    opened = client.stream(EVENTS_PATH, params, None)
    first = next(opened, None)
    if first is None:
        raise StreamDropped(f"the stream at {client.url} ended as it opened")
    return Stream(client, params, first.id, opened)


def blocks(stream: Stream) -> Iterator[Block]:
    """Every block from the place read last on, events and keep-alives, for ever."""
    on_block()  # the first block, the stream's place, is handled: the command listed
    failures = 0
    while True:
        try:
            for block in stream.open:
                failures = 0
                if block.id is not None:
                    stream.last = block.id
                yield block
                on_block()
            reason = "the stream ended"
        except (StreamDropped, InstanceUnreachable) as exc:
            reason = str(exc)
        except OwnerApiError as exc:
            if exc.status < 500:  # refused for good: 401, 403, 410
                raise
            reason = f"{exc} ({exc.status})"  # the database away: the stream comes back
        wait = RECONNECT_S[min(failures, len(RECONNECT_S) - 1)]
        print(f"watch: {reason}; reconnecting in {wait:g}s from {stream.last}", file=sys.stderr,
              flush=True)  # fmt: skip
        pause(wait)
        failures += 1
        stream.open = stream.client.stream(EVENTS_PATH, stream.params, stream.last)


def events(stream: Stream) -> Iterator[dict[str, Any]]:
    """The events only (their data), across reconnects."""
    for block in blocks(stream):
        if block.data is not None:
            yield dict(json.loads(block.data))
