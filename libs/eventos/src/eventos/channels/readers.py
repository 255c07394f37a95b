"""Channel readers (SPEC §6.4), run by ingress: one reader per account across all replicas.

Every few seconds the supervisor reads which accounts a running generation subscribes to,
takes or renews each account's lease (`channel_accounts`, fenced by a token that grows with
every new holder), starts a reader for each lease it holds and stops the others. A reader
commits each page of events together with its cursor in one transaction that first checks
the lease's fence, so a reader that lost its lease writes nothing. A read that fails marks the
account down; down for longer than `down_alert_s` raises an attention item for each employee
reading it, resolved by the next good read.

Before each read the account's backlog (SPEC §15, `backlog.py`) is counted: past the bound a
reader whose provider keeps what it was not asked for stops reading until the backlog is
back under 90 %, and a read asks for no more than the room left; the Discord gateway, which
cannot hold a session's events, reads on (`holds_unread` False) with the item raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import httpx
import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos import secret_purposes as purposes
from eventos.bus.envelope import encoded_size
from eventos.bus.inbox import IngressRecord, Rejected, append, append_isolated
from eventos.channels.backlog import Gate, account_backlog, raise_pause, resolve_pause
from eventos.channels.settings import ChannelSettings
from eventos.channels.threads import instance_salt
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import DatabaseUnavailable, EventOSError
from eventos.runtime.wake import Kicker
from eventos.settings import SecretStore

log = logging.getLogger(__name__)
BACKOFF_MAX_S = 30.0
PAGE_UNBOUNDED = 1_000  # the read limit of a reader that cannot pause (its own page is less)
Page = tuple[list[dict[str, Any]], dict[str, Any]]  # the items read, and the cursor after them


class ChannelReader(Protocol):
    """One channel's reads: a page from a cursor, and each item as a record."""

    driver: str
    holds_unread: bool  # the provider keeps what is not read (the reader may pause)

    async def read(self, token: bytes, cursor: dict[str, Any], limit: int) -> Page:
        """A page of at most `limit` items from the cursor, and the cursor after it."""
        ...

    def record(self, account_id: str, salt: bytes, item: dict[str, Any]) -> IngressRecord: ...

    async def confirm(self, token: bytes, items: list[dict[str, Any]]) -> None:
        """After the page committed: tell the provider (mark mail read); a failure is logged,
        never a loss (the cursor already moved past the page)."""


@dataclass(frozen=True)
class Lease:
    """An account this replica reads, under the fencing token its lease was taken with."""

    id: str  # `<driver>:<account>`, the events' source
    driver: str
    fencing: int
    cursor: dict[str, Any]

    @property
    def credential_ref(self) -> str:
        return self.id.partition(":")[2]


class LeaseLost(EventOSError):
    """Another replica holds the account's lease now."""


def unstorable(rec: IngressRecord, reason: str) -> IngressRecord:
    """The dead row of an item PostgreSQL refused, its dedupe key kept."""
    envelope = {**(rec.envelope or {}), "data": {"dedupe_key": rec.dedupe_key}}
    return replace(rec, envelope=envelope, size=encoded_size(envelope),
                   status=names.INGRESS_DEAD, error=reason)  # fmt: skip


class ChannelReaders:
    """The supervisor of this replica's readers (a service loop of ingress)."""

    def __init__(self, pool: AsyncConnectionPool[Conn], secrets: SecretStore,
                 settings: ChannelSettings, readers: Mapping[str, ChannelReader],
                 kicker: Kicker | None = None, owner: str | None = None) -> None:  # fmt: skip
        self.pool, self.secrets, self.settings = pool, secrets, settings
        self.readers, self.kicker = dict(readers), kicker
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.running: dict[str, tuple[Lease, asyncio.Task[None]]] = {}
        self.salt: bytes | None = None

    async def run(self) -> None:
        """Refresh the leases until cancelled; the readers stop and give their leases back."""
        try:
            while True:
                try:
                    await self.refresh()
                except (DatabaseUnavailable, psycopg.Error, OSError) as exc:
                    # psycopg's own errors too: a renewal that waits out its statement timeout
                    # behind a reader's stalled commit must not end the ingress service.
                    log.warning("channel readers: refresh failed: %s", exc)
                await asyncio.sleep(self.settings.refresh_s)
        finally:
            await self.stop()

    async def refresh(self) -> None:
        """One round: the wanted accounts' leases taken or renewed, readers started/stopped."""
        async with self.pool.connection() as conn:
            if self.salt is None:
                self.salt = await instance_salt(conn)
            cur = await conn.execute(Q["channel_accounts_wanted"], {"drivers": list(self.readers)})
            wanted = {str(r["id"]): str(r["driver"]) for r in await cur.fetchall()}
            for account in [a for a in self.running if a not in wanted]:
                await self._stop(account)
                await conn.execute(Q["channel_account_release"],
                                   {"id": account, "owner": self.owner})  # fmt: skip
            for account, driver in wanted.items():
                lease = await self._acquire(conn, account, driver)
                self._keep(account, lease)

    async def _acquire(self, conn: Conn, account: str, driver: str) -> Lease | None:
        ref = account.partition(":")[2]
        await conn.execute(Q["channel_account_upsert"],
                           {"id": account, "driver": driver, "credential_ref": ref})  # fmt: skip
        cur = await conn.execute(Q["channel_account_acquire"], {
            "id": account, "owner": self.owner, "ttl_s": self.settings.lease_ttl_s,
        })  # fmt: skip
        row = await cur.fetchone()
        if row is None:
            return None
        return Lease(account, driver, int(row["fencing"]), dict(row["cursor"] or {}))

    def _keep(self, account: str, lease: Lease | None) -> None:
        held = self.running.get(account)
        if held is not None and (lease is None or held[0].fencing != lease.fencing
                                 or held[1].done()):  # fmt: skip
            held[1].cancel()
            del self.running[account]
            held = None
        if lease is not None and held is None:
            task = asyncio.create_task(self._read_loop(lease), name=f"reader {account}")
            self.running[account] = (lease, task)

    async def _stop(self, account: str) -> None:
        _, task = self.running.pop(account)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def stop(self) -> None:
        """Stop every reader and give its lease back (another replica takes over at once)."""
        accounts = list(self.running)
        for account in accounts:
            await self._stop(account)
        with contextlib.suppress(Exception):
            async with self.pool.connection(timeout=2.0) as conn:
                for account in accounts:
                    await conn.execute(Q["channel_account_release"],
                                       {"id": account, "owner": self.owner})  # fmt: skip

    async def _read_loop(self, lease: Lease) -> None:
        reader, cursor, backoff = self.readers[lease.driver], lease.cursor, 1.0
        gate = Gate(self.settings.backlog_max)
        while True:
            try:
                room = await self._room(lease, reader, gate)
                if room == 0:  # past the bound: the provider keeps the rest; asked again later
                    await asyncio.sleep(self.settings.refresh_s)
                    continue
                token = self.secrets.resolve(lease.credential_ref, purposes.CHANNEL)
                items, after = await reader.read(token, cursor, room)
                appended = await self._commit(lease, reader, items, after)
            except LeaseLost:
                log.info("channel %s: lease lost; this replica stops reading it", lease.id)
                return
            except (EventOSError, httpx.HTTPError, OSError, psycopg.Error) as exc:
                await self._down(lease, f"{type(exc).__name__}: {exc}"[:500])
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            cursor, backoff = after, 1.0
            if appended and self.kicker is not None:
                self.kicker.kick()
            if items:
                try:
                    await reader.confirm(token, items)
                except (EventOSError, httpx.HTTPError, OSError) as exc:
                    log.warning("channel %s: confirming a committed page failed: %s", lease.id, exc)

    async def _room(self, lease: Lease, reader: ChannelReader, gate: Gate) -> int:
        """How many items the next read may take (0: paused); a pause raises its item, the
        resume resolves it."""
        async with self.pool.connection() as conn:
            backlog = await account_backlog(conn, lease.id, gate.bound)
            was = gate.paused
            room = gate.room(backlog)
            if gate.paused and was is not True:
                action = "paused" if reader.holds_unread else "over"
                await raise_pause(conn, lease.id, lease.driver, backlog, gate.bound, action)
            elif not gate.paused and was is not False:
                await resolve_pause(conn, lease.id)
        return room if reader.holds_unread else PAGE_UNBOUNDED

    async def _commit(self, lease: Lease, reader: ChannelReader, items: list[dict[str, Any]],
                      after: dict[str, Any]) -> int:  # fmt: skip
        """The page and the cursor after it, in one transaction fenced by the lease."""
        assert self.salt is not None  # set by the first refresh, before any reader starts
        fence = {"id": lease.id, "owner": self.owner, "fencing": lease.fencing}
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(Q["channel_account_fence"], fence)
            row = await cur.fetchone()
            if row is None:
                raise LeaseLost(lease.id)
            records = [reader.record(lease.id, self.salt, item) for item in items]
            outcomes = await append_isolated(conn, records)
            dead = [unstorable(r, o.reason) for r, o in zip(records, outcomes, strict=True)
                    if isinstance(o, Rejected)]  # fmt: skip
            await append(conn, dead)
            await conn.execute(Q["channel_account_read"], {**fence, "cursor": Jsonb(after)})
            if row["down_since"] is not None:
                up = {"kind": names.ATTENTION_CHANNEL_DOWN, "ref": lease.id}
                await conn.execute(Q["attention_resolve"], up)
        return len(records)

    async def _down(self, lease: Lease, error: str) -> None:
        log.warning("channel %s: read failed: %s", lease.id, error)
        fence = {"id": lease.id, "owner": self.owner, "fencing": lease.fencing}
        with contextlib.suppress(DatabaseUnavailable, OSError):
            async with self.pool.connection() as conn:
                cur = await conn.execute(Q["channel_account_down"], {**fence, "error": error})
                row = await cur.fetchone()
                if row is not None and float(row["down_s"]) >= self.settings.down_alert_s:
                    detail = (
                        f"channel {lease.id} has not been read for {row['down_s']:.0f} s: {error}"
                    )
                    await conn.execute(Q["channel_item_raise"], {
                        "id": lease.id, "kind": names.ATTENTION_CHANNEL_DOWN, "severity": "error",
                        "detail": detail,
                    })  # fmt: skip
