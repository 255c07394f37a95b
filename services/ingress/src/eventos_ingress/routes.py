"""The webhook route table and unrouted backlog, reloaded every second off the request path.

A request reads only memory while the table is fresh. A path missing from it is looked up in
the database before answering 404, so an endpoint answers as soon as its Start commits; a
path that went away keeps answering for at most one refresh (its events then settle as
`no_consumer`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q

log = logging.getLogger(__name__)
REFRESH_S = 1.0
STALE_AFTER_S = 5.0  # past this the table is not trusted and requests ask the database


@dataclass(frozen=True)
class Endpoint:
    """What a webhook path resolves to."""

    path: str
    employee: str
    klass: int
    scheme: str
    secret_ref: str | None
    header: str | None
    tolerance_s: int
    max_body: int
    dedupe_header: str | None
    signed: bool

    @property
    def source_key(self) -> str:
        return names.source_key(names.SOURCE_WEBHOOK, self.path)


def endpoint_of(path: str, row: dict[str, Any], provider_schemes: tuple[str, ...]) -> Endpoint:
    params = row["params"]
    verify_cfg = params.get("verify", {})
    scheme = str(verify_cfg.get("scheme", "none"))
    return Endpoint(
        path=path,
        employee=str(row["employee"]),
        klass=int(row["class"]),
        scheme=scheme,
        secret_ref=verify_cfg.get("secret"),
        header=verify_cfg.get("header"),
        tolerance_s=int(verify_cfg.get("tolerance_s", 300)),
        max_body=int(params.get("max_body", names.DEFAULT_MAX_BODY)),
        dedupe_header=params.get("dedupe_header"),
        signed=scheme in provider_schemes,
    )


@dataclass
class RouteTable:
    """Endpoints by path and unrouted counts by source, as of the last refresh."""

    pool: AsyncConnectionPool[Conn]
    provider_schemes: tuple[str, ...]
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    unrouted: dict[str, int] = field(default_factory=dict)
    loaded_at: float = float("-inf")

    @property
    def fresh(self) -> bool:
        return time.monotonic() - self.loaded_at < STALE_AFTER_S

    async def refresh(self) -> None:
        """Reload both tables in one connection."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(Q["webhook_endpoints"])
            rows = await cur.fetchall()
            cur = await conn.execute(Q["webhook_unrouted_counts"])
            counts = {str(r["source_key"]): int(r["n"]) for r in await cur.fetchall()}
        prefix = names.source_key(names.SOURCE_WEBHOOK, "")
        self.endpoints = {
            (path := str(r["source_key"]).removeprefix(prefix)): endpoint_of(
                path, r, self.provider_schemes
            )
            for r in rows
        }
        self.unrouted = counts
        self.loaded_at = time.monotonic()

    async def refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:
                log.warning("route table refresh failed: %s", exc)
            await asyncio.sleep(REFRESH_S)

    async def resolve(self, path: str) -> Endpoint | None:
        """The endpoint of `path`, from memory when fresh, else from the database."""
        found = self.endpoints.get(path)
        if found is not None and self.fresh:
            return found
        async with self.pool.connection() as conn:
            source = names.source_key(names.SOURCE_WEBHOOK, path)
            cur = await conn.execute(Q["webhook_endpoint"], {"source_key": source})
            row = await cur.fetchone()
        if row is None:
            return None
        endpoint = endpoint_of(path, row, self.provider_schemes)
        self.endpoints[path] = endpoint
        return endpoint

    async def backlog(self, source: str, cap: int) -> int:
        """Unrouted rows of a source (counted up to `cap`), as of the last refresh."""
        if self.fresh:
            return self.unrouted.get(source, 0)
        async with self.pool.connection() as conn:
            params = {"source_key": source, "cap": cap}
            cur = await conn.execute(Q["ingress_unrouted_count"], params)
            return int((await cur.fetchone() or {})["n"])
