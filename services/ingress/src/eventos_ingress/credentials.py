"""Who is calling the gRPC EventIngress, and what it may publish (SPEC §6.3).

A driver is declared by the `grpc` triggers of starting, running and paused generations
(`driver: drv-1` makes the source `grpc:drv-1`); its token is a secret reference
(`token:`, default `driver-<driver id>`) resolved by the SecretStore. Internal producers
hold `EVENTOS_INTERNAL_TOKEN`. The table is reloaded every second off the call path; a token
missing from it is looked up in the database before the call is refused, so a driver
authenticates as soon as its generation's Start commits.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos import secret_purposes as purposes
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import DatabaseUnavailable, SecretUnavailable
from eventos.settings import SecretStore

log = logging.getLogger(__name__)
REFRESH_S = 1.0
STALE_AFTER_S = 5.0  # past this the table is not trusted and calls ask the database
BEARER = "bearer "


@dataclass(frozen=True)
class Internal:
    """An internal producer or tool (the internal token)."""


@dataclass(frozen=True)
class Driver:
    """A channel driver, by the driver id its token is bound to."""

    driver_id: str


Principal = Internal | Driver


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> bytes | None:
    """The token of an `authorization: Bearer <token>` metadata entry, if there is one."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        if text[: len(BEARER)].lower() == BEARER and text[len(BEARER) :].strip():
            return text[len(BEARER) :].strip().encode("utf-8", "surrogateescape")
    return None


@dataclass
class DriverTable:
    """Drivers' tokens and sources, as of the last reload."""

    pool: AsyncConnectionPool[Conn]
    secrets: SecretStore
    internal_token: str | None = field(default=None, repr=False)
    tokens: list[tuple[bytes, str]] = field(default_factory=list, repr=False)
    sources: dict[str, frozenset[str]] = field(default_factory=dict)
    loaded_at: float = float("-inf")
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _unresolved: set[str] = field(default_factory=set)

    @property
    def fresh(self) -> bool:
        return time.monotonic() - self.loaded_at < STALE_AFTER_S

    async def refresh(self) -> None:
        """Reload every declared driver and resolve its token; DatabaseUnavailable if the
        database cannot answer."""
        started = time.monotonic()
        try:
            async with self.pool.connection() as conn:
                cur = await conn.execute(Q["grpc_drivers"])
                rows = await cur.fetchall()
        except Exception as exc:
            raise DatabaseUnavailable(f"driver table: {type(exc).__name__}") from exc
        prefix = names.source_key(names.SOURCE_GRPC, "")
        sources: dict[str, set[str]] = {}
        refs: dict[str, set[str]] = {}
        for row in rows:
            driver = str(row["source_key"]).removeprefix(prefix)
            sources.setdefault(driver, set()).add(str(row["source_key"]))
            refs.setdefault(driver, set()).add(row["token_ref"] or names.driver_token_ref(driver))
        self.tokens = [
            (tok, d) for d, rs in refs.items() for r in sorted(rs) for tok in self._tokens(r)
        ]
        self.sources = {d: frozenset(s) for d, s in sources.items()}
        self.loaded_at = started

    def _tokens(self, ref: str) -> tuple[bytes, ...]:
        """The driver's token and, within a rotation's overlap window, its previous one."""
        try:
            found = self.secrets.versions(ref, purposes.DRIVER)
        except SecretUnavailable:
            if ref not in self._unresolved:
                log.warning("driver token %r is not available; that driver cannot publish", ref)
                self._unresolved.add(ref)
            return ()
        self._unresolved.discard(ref)
        return tuple(token for token in found.all() if token)

    async def refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:
                log.warning("driver table refresh failed: %s", exc)
            await asyncio.sleep(REFRESH_S)

    def _match(self, given: bytes) -> Principal | None:
        # Every candidate is compared, in constant time each: the answer's timing does not
        # say which token came close.
        found: set[Principal] = set()
        if self.internal_token and hmac.compare_digest(given, self.internal_token.encode()):
            found.add(Internal())
        for token, driver in self.tokens:
            if hmac.compare_digest(given, token):
                found.add(Driver(driver))
        if len(found) > 1:
            log.warning("a token is shared by %d principals; refusing it", len(found))
            return None
        return next(iter(found), None)

    async def _reload(self, asked_at: float) -> None:
        # Single flight: calls that missed while a reload ran share the next one at most.
        async with self._lock:
            if self.loaded_at >= asked_at:
                return  # a reload that began after this call asked has answered it
            await self.refresh()

    async def authenticate(self, given: bytes | None) -> Principal | None:
        """The principal a bearer token belongs to, or None."""
        if given is None:
            return None
        asked_at = time.monotonic()
        found = self._match(given) if self.fresh else None
        if found is None:
            await self._reload(asked_at)
            found = self._match(given)
        return found

    async def sources_of(self, driver: str) -> frozenset[str]:
        """The sources a driver may publish now (empty once no live generation declares it)."""
        if not self.fresh:
            await self._reload(time.monotonic())
        return self.sources.get(driver, frozenset())
