"""Bodies over 64 KB travel by reference (SPEC §2 I7): a file named by its sha256, plus a row."""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from eventos.db import Conn
from eventos.db.sql import Q


@dataclass(frozen=True)
class BlobStore:
    """A directory of bodies; the database row is what makes a reference valid."""

    root: Path

    def write(self, body: bytes) -> tuple[str, str, Path]:
        """Store `body` durably; returns (blob id, sha256, path)."""
        digest = hashlib.sha256(body).hexdigest()
        folder = self.root / digest[:2]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / digest
        if not path.exists():
            tmp = folder / f".{digest}.{uuid.uuid4().hex}"
            with tmp.open("wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
        return f"blob_{uuid.uuid4().hex}", digest, path

    async def record(self, conn: Conn, body: bytes) -> str:
        """Write the body and its event_blobs row (committed); returns the reference."""
        blob_id, digest, path = self.write(body)
        async with conn.transaction():
            params = {"id": blob_id, "sha256": digest, "path": str(path), "size": len(body)}
            await conn.execute(Q["blob_insert"], params)
        return blob_id

    def read(self, digest: str) -> bytes:
        return (self.root / digest[:2] / digest).read_bytes()


async def blob_exists(conn: Conn, blob_id: str) -> bool:
    cur = await conn.execute(Q["blob_exists"], {"id": blob_id})
    return await cur.fetchone() is not None
