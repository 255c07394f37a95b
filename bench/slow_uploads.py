"""Slow large uploads, run as their own process: `python bench/slow_uploads.py '<json config>'`.

Each upload opens its own connection, sends the headers of a signed `size`-byte body, then the
body in 64 KiB pieces spread evenly over `seconds`, and reads the answer. The body is the same
bytes for every upload (its HMAC is computed once) and each carries its own X-Event-Id. Prints
one JSON line: answers by status, errors, and how long the uploads took.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sys
import time
from collections import Counter
from typing import Any

PIECE = 64 * 1024
ANSWER_TIMEOUT_S = 120.0


async def upload(
    cfg: dict[str, Any], i: int, body: bytes, signature: str, tally: Counter[str]
) -> None:
    path = cfg["paths"][i % len(cfg["paths"])]
    head = (
        f"POST /hooks/{path} HTTP/1.1\r\nHost: {cfg['host']}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
        f"X-Event-Id: {cfg['id_prefix']}{i}\r\n{cfg['signature_header']}: {signature}\r\n\r\n"
    ).encode()
    pieces = range(0, len(body), PIECE)
    pause = cfg["seconds"] / max(1, len(pieces))
    try:
        reader, writer = await asyncio.open_connection(cfg["host"], cfg["port"])
    except OSError as exc:
        tally[f"connect:{type(exc).__name__}"] += 1
        return
    try:
        writer.write(head)
        for start in pieces:
            writer.write(body[start : start + PIECE])
            await writer.drain()
            await asyncio.sleep(pause)
        line = await asyncio.wait_for(reader.readline(), ANSWER_TIMEOUT_S)
        tally[line.split(b" ", 2)[1].decode() if line else "no answer"] += 1
    except (OSError, TimeoutError) as exc:
        tally[f"error:{type(exc).__name__}"] += 1
    finally:
        writer.close()


async def main(cfg: dict[str, Any]) -> dict[str, Any]:
    body = (b"0123456789abcdef" * (cfg["size"] // 16 + 1))[: cfg["size"]]
    signature = hmac.new(cfg["secret"].encode(), body, hashlib.sha256).hexdigest()
    tally: Counter[str] = Counter()
    started = time.monotonic()
    # Started over the first second, not all in one instant.
    tasks = []
    for i in range(cfg["uploads"]):
        tasks.append(asyncio.create_task(upload(cfg, i, body, signature, tally)))
        await asyncio.sleep(1.0 / cfg["uploads"])
    await asyncio.gather(*tasks)
    return {"answers": dict(sorted(tally.items())), "seconds": time.monotonic() - started}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
