"""Bodies over 64 KB travel by reference (SPEC §2 I7, §5): `event_blobs` rows whose content is
in the database by default, one durable store to back up and restore, so a body survives the
pod that took it.

Content is written and read in chunks of CHUNK_BYTES (a binary COPY), so neither side ever
holds a whole body: a webhook's body is spooled to a temporary file while its HMAC is computed
and copied from there after it verified.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Protocol

from eventos import names
from eventos.db import Conn, translate
from eventos.db.sql import Q

CHUNK_BYTES = 256 * 1024
# A spool keeps this much in memory; past it the body goes to a temporary file.
SPOOL_MEMORY_BYTES = names.ENVELOPE_MAX_BYTES
BLOB_PREFIX = "blob_"


class ChunkSink(Protocol):
    def update(self, chunk: bytes, /) -> None: ...


def new_blob_id() -> str:
    return BLOB_PREFIX + uuid.uuid4().hex


@dataclass
class Spool:
    """A body being received: its size and sha256 as it grows, in memory up to 64 KiB and in
    an unlinked temporary file past that (`directory`, else the system's)."""

    directory: str | None = None
    size: int = 0
    _sha: hashlib._Hash = field(default_factory=hashlib.sha256)
    _file: IO[bytes] = field(init=False)

    def __post_init__(self) -> None:
        # Closed by `close()`: the spool outlives any one block of its owner.
        self._file = tempfile.SpooledTemporaryFile(SPOOL_MEMORY_BYTES, dir=self.directory)  # noqa: SIM115

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()

    @property
    def in_memory(self) -> bool:
        return self.size <= SPOOL_MEMORY_BYTES

    async def write(self, chunk: bytes, feed: Sequence[ChunkSink] = ()) -> None:
        """Append a chunk, feeding it to each sink (a signature check) in order first. Past the
        memory part, hashing and writing run in a worker thread: hashlib lets go of the GIL on
        large buffers, so the event loop serves other requests meanwhile."""
        if self.size + len(chunk) <= SPOOL_MEMORY_BYTES:
            self._absorb(chunk, feed)
        else:
            await asyncio.to_thread(self._absorb, chunk, feed)
        self.size += len(chunk)

    def _absorb(self, chunk: bytes, feed: Sequence[ChunkSink]) -> None:
        for sink in feed:
            sink.update(chunk)
        self._sha.update(chunk)
        self._file.write(chunk)

    def head(self, limit: int) -> bytes:
        """The first `limit` bytes."""
        self._file.seek(0)
        return self._file.read(limit)

    def value(self) -> bytes:
        """The whole body: only for bodies that stayed in memory."""
        if not self.in_memory:
            raise ValueError("a spooled body is read in chunks, not whole")
        self._file.seek(0)
        return self._file.read()

    async def read_all(self) -> bytes:
        """The whole body, read off the event loop (the caller bounds how many at once)."""
        self._file.seek(0)
        return await asyncio.to_thread(self._file.read)

    async def chunks(self) -> AsyncIterator[bytes]:
        self._file.seek(0)
        while chunk := await asyncio.to_thread(self._file.read, CHUNK_BYTES):
            yield chunk

    def close(self) -> None:
        self._file.close()


async def _chunks_of(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), CHUNK_BYTES):
        yield body[start : start + CHUNK_BYTES]


async def store(conn: Conn, body: bytes | Spool) -> str:
    """Write a body and its row in one transaction (committed on return); its reference."""
    blob_id = new_blob_id()
    if isinstance(body, Spool):
        digest, size, chunks = body.sha256, body.size, body.chunks()
    else:
        digest, size, chunks = hashlib.sha256(body).hexdigest(), len(body), _chunks_of(body)
    async with translate(), conn.transaction():
        await conn.execute(Q["blob_insert"], {"id": blob_id, "sha256": digest, "size": size})
        async with conn.cursor().copy(Q["blob_chunks_copy"]) as copy:
            copy.set_types(["text", "int4", "bytea"])
            n = 0
            async for chunk in chunks:
                await copy.write_row((blob_id, n, chunk))
                n += 1
    return blob_id


async def read(conn: Conn, blob_id: str) -> bytes:
    """A body's content (whole: for consumers that need it, within the body cap)."""
    cur = await conn.execute(Q["blob_chunks"], {"id": blob_id})
    return b"".join([bytes(r["content"]) for r in await cur.fetchall()])


async def blob_exists(conn: Conn, blob_id: str) -> bool:
    cur = await conn.execute(Q["blob_exists"], {"id": blob_id})
    return await cur.fetchone() is not None


async def expire(conn: Conn, *, limit: int = 1000) -> int:
    """Delete bodies past their retention; how many went."""
    params = {"retention_days": names.INGRESS_RETENTION_DAYS, "limit": limit}
    cur = await conn.execute(Q["blob_expire"], params)
    return cur.rowcount
