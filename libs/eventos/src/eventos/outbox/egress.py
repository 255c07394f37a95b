"""Egress (SPEC §11): deliver an outbox row once, or say `unknown` when that cannot be known.

Owner chat's "provider" is our own table: the reply is written to `chat_events` (once per
outbox row) in the transaction that claims and settles the row.

A channel send, in order: the account's high water (a turn producing more than the account can
take waits), a token from the account's and the recipient's buckets, the claim by
compare-and-swap, `provider_called_at` just before the call, the call with no connection held,
then the outcome settled under the claim's token. An attempt that finds a `sending` row whose
claim has expired takes it over when the provider was never called (or takes an idempotency
key); otherwise the row is `unknown`, with an attention item offering Retry, and is never resent
on its own. A wait is `SendWait`: the activity ends its attempt with that delay, holding nothing.

The recipient is sealed at rest (`eventos.outbox.keys`) and opened only here. One that does not
open fails its row (nothing was sent) with an attention item: a data error of one row.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from eventos import failures, names
from eventos import secret_purposes as purposes
from eventos.channels import buckets
from eventos.channels.senders import (
    Deferred,
    Delivered,
    Held,
    Outgoing,
    Refused,
    Sender,
    SendOutcome,
    Unclear,
)
from eventos.channels.settings import ChannelSettings
from eventos.channels.threads import counterpart_hash, instance_salt
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import (
    Conflict,
    DatabaseUnavailable,
    EventOSError,
    NotFound,
    RecipientUnreadable,
    SecretUnavailable,
)
from eventos.outbox.keys import OutboxKeys, Sealed
from eventos.runtime.metrics import EGRESS_LATENCY
from eventos.settings import SecretStore

SENT = "sent"
FAILED = "failed"
UNKNOWN = "unknown"
QUEUED = "queued"
HELD = "held"
HIGH_WATER_WAIT_S = 1.0
RETRY_POLL_S = 2.0  # how often the egress looks for sends an owner retried
RETRY_BATCH = 50
UNCLEAR_RETRIES = 4  # calls of an idempotent provider whose answers were unclear, then unknown
WARNINGS = (names.ATTENTION_SEND_UNKNOWN, names.ATTENTION_SEND_HELD)
# A send's attention items, each offering Retry.
SEND_ITEM_KINDS = (names.ATTENTION_SEND_UNKNOWN, names.ATTENTION_SEND_FAILED,
                   names.ATTENTION_SEND_HELD)  # fmt: skip
log = logging.getLogger(__name__)


class SendWait(EventOSError):
    """The send must wait (a bucket, the high water, a claim still running)."""

    def __init__(self, reason: str, wait_s: float) -> None:
        super().__init__(f"{reason}; again in {wait_s:.1f} s")
        self.wait_s = wait_s


def recipient_of(row: dict[str, Any], keys: OutboxKeys) -> str | None:
    """The row's recipient in the clear (None when it has none)."""
    if row["recipient"] is None:
        return None
    sealed = Sealed(str(row["recipient_key_id"]), bytes(row["recipient"]))
    return keys.open(sealed, employee=row["employee"], idempotency_key=row["idempotency_key"])


def cause(outcome: Refused | Unclear) -> str:
    """A failed or unclear send's cause as the owner reads it: `<category>: <reason>`, the
    reason redacted and bounded (eventos.failures)."""
    return f"{outcome.category}: {failures.clean(outcome.reason)}"


async def _raise(conn: Conn, row: dict[str, Any], kind: str, detail: str,
                 action: str | None = None) -> None:  # fmt: skip
    await conn.execute(Q["attention_raise_action"], {
        "employee": row["employee"], "kind": kind,
        "severity": "warning" if kind in WARNINGS else "error",
        "ref": f"outbox#{row['id']}", "thread": row["thread"], "detail": detail[:1000],
        "action": action,
    })  # fmt: skip


async def _fail_unreadable(conn: Conn, row: dict[str, Any], exc: RecipientUnreadable) -> str:
    await conn.execute(Q["outbound_fail"], {"id": row["id"]})
    await _raise(conn, row, names.ATTENTION_RECIPIENT_UNREADABLE,
                 f"outbox row {row['id']} was not sent: {exc}")  # fmt: skip
    log.error("outbox row %d failed unsent: %s", row["id"], exc)
    return FAILED


async def send_chat(conn: Conn, outbound_id: int, keys: OutboxKeys) -> str:
    """Owner chat: claim, write the reply for the session's stream, settle; one transaction."""
    token = uuid.uuid4().hex
    started = time.monotonic()
    async with conn.transaction():
        cur = await conn.execute(Q["outbound_claim"], {"id": outbound_id, "token": token})
        row = await cur.fetchone()
        if row is None:
            row = await _get(conn, outbound_id)
            if row["status"] != "sending":
                return str(row["status"])
            # An attempt broke off after its claim. The chat "provider" is our own table,
            # whose unique outbound_id makes a second write a no-op: finishing is safe.
        try:
            session = recipient_of(row, keys) or "owner"
        except RecipientUnreadable as exc:
            return await _fail_unreadable(conn, row, exc)
        await conn.execute(Q["chat_reply_insert"], {
            "employee": row["employee"], "session": session,
            "outbound_id": outbound_id, "turn_id": row["turn_id"], "text": row["body"],
        })  # fmt: skip
        await conn.execute(Q["outbound_sent"], {"id": outbound_id})
    EGRESS_LATENCY.labels(str(row["kind"])).observe(
        float(row["age_s"]) + time.monotonic() - started
    )  # from the row's write (by the database's clock) to the committed send
    return SENT


async def _get(conn: Conn, outbound_id: int) -> dict[str, Any]:
    cur = await conn.execute(Q["outbound_get"], {"id": outbound_id})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no outbox row {outbound_id}")
    return dict(row)


@dataclass
class Egress:
    """Sends outbox rows: owner chat always, channels through their senders."""

    pool: AsyncConnectionPool[Conn]
    keys: OutboxKeys
    senders: Mapping[str, Sender] = field(default_factory=dict)
    secrets: SecretStore | None = None
    settings: ChannelSettings = field(default_factory=ChannelSettings)
    _salt: bytes | None = None

    async def send(self, outbound_id: int, claim_ttl_s: float = names.SEND_CLAIM_TTL_S) -> str:
        """Deliver one outbox row; its status after the attempt (SendWait: try later). A claim
        an earlier attempt left is taken over once `claim_ttl_s` old: the attempts' timeout
        (the send activity passes its own), so no attempt still running loses its claim."""
        async with self.pool.connection() as conn:
            row = await _get(conn, outbound_id)
            if row["kind"] == names.KIND_CHAT:
                return await send_chat(conn, outbound_id, self.keys)
            if row["status"] not in (QUEUED, "sending"):
                return str(row["status"])
            sender = self.senders.get(str(row["kind"]))
            if sender is None:  # no sender for this channel here: the row waits, queued
                log.warning("outbox row %d waits: no sender for %r", outbound_id, row["kind"])
                return QUEUED
            try:
                recipient = recipient_of(row, self.keys)
                if recipient is None:
                    raise RecipientUnreadable("the send has no recipient")
            except RecipientUnreadable as exc:
                return await _fail_unreadable(conn, row, exc)
            if row["status"] == "sending":
                token = await self._take_over(conn, row, sender, claim_ttl_s)
            else:
                token = await self._claim(conn, row, recipient)
            if token is None:
                return str((await _get(conn, outbound_id))["status"])
            out = await self._outgoing(conn, row, token, recipient)
            if isinstance(out, str):
                return out
            await conn.execute(Q["outbound_calling"], {"id": outbound_id, "token": token})
        started = time.monotonic()
        outcome = await sender.send(out)  # no connection is held while the provider answers
        async with self.pool.connection() as conn:
            status = await self._settle(conn, row, token, outcome, sender.idempotent)
        if status == SENT:
            waited = float(row["age_s"]) + time.monotonic() - started
            EGRESS_LATENCY.labels(str(row["kind"])).observe(waited)
        return status

    async def _salt_of(self, conn: Conn) -> bytes:
        if self._salt is None:
            self._salt = await instance_salt(conn)
        return self._salt

    async def _claim(self, conn: Conn, row: dict[str, Any], recipient: str) -> str | None:
        """High water, buckets, then the claim (None: another attempt took the row)."""
        account, driver = str(row["account"]), str(row["kind"])
        cur = await conn.execute(Q["outbound_open_ahead"], {"account": account, "id": row["id"]})
        ahead = int((await cur.fetchone() or {"n": 0})["n"])
        if ahead >= self.settings.high_water:
            raise SendWait(f"{ahead} sends of {account} are ahead (high water)", HIGH_WATER_WAIT_S)
        if row["approval_id"] is not None:  # approved sends go out in decision order
            params = {"employee": row["employee"], "outbound_id": row["id"]}
            cur = await conn.execute(Q["approvals_ahead"], params)
            before = int((await cur.fetchone() or {"n": 0})["n"])
            if before:
                raise SendWait(f"{before} approved send(s) decided earlier go first", 0.5)
        counterpart = counterpart_hash(await self._salt_of(conn), driver, account, recipient)
        refs = [
            buckets.BucketRef(
                buckets.account_key(account), self.settings.bucket(driver, "account")
            ),
            buckets.BucketRef(
                buckets.recipient_key(driver, counterpart),
                self.settings.bucket(driver, "recipient"),
            ),
        ]
        wait = await buckets.take(conn, refs, int(row["class"]))
        if wait > 0:
            raise SendWait(f"the send buckets of {account} are empty", wait)
        token = uuid.uuid4().hex
        cur = await conn.execute(Q["outbound_claim"], {"id": row["id"], "token": token})
        return token if await cur.fetchone() is not None else None

    async def _take_over(self, conn: Conn, row: dict[str, Any], sender: Sender,
                         ttl_s: float) -> str | None:  # fmt: skip
        """An earlier attempt's claim: wait it out, take it over, or call the row `unknown`."""
        age = float(row["claim_age_s"] or 0.0)
        if age < ttl_s:
            raise SendWait(f"outbox row {row['id']} is being sent", ttl_s - age)
        token = uuid.uuid4().hex
        if row["provider_called_at"] is None or sender.idempotent:
            cur = await conn.execute(Q["outbound_reclaim"], {
                "id": row["id"], "token": token, "old": row["claim_token"],
                "idempotent": sender.idempotent,
            })  # fmt: skip
            return token if await cur.fetchone() is not None else None
        await self._unknown(conn, row, str(row["claim_token"]),
                            "the attempt that called the provider broke off")  # fmt: skip
        return None

    async def _outgoing(self, conn: Conn, row: dict[str, Any], token: str,
                        recipient: str) -> Outgoing | str:  # fmt: skip
        """The call's input; a credential that cannot be read fails the row."""
        ref = str(row["account"]).partition(":")[2]
        try:
            if self.secrets is None:
                raise SecretUnavailable(f"no secret store to resolve {ref!r}")
            credential = self.secrets.resolve(ref, purposes.CHANNEL)
        except SecretUnavailable as exc:
            return await self._settle(conn, row, token, Refused(str(exc)))
        return Outgoing(int(row["id"]), str(row["idempotency_key"]), ref, credential,
                        recipient, str(row["body"] or ""))  # fmt: skip

    async def _settle(self, conn: Conn, row: dict[str, Any], token: str, outcome: SendOutcome,
                      idempotent: bool = False) -> str:  # fmt: skip
        p = {"id": row["id"], "token": token}
        if isinstance(outcome, Delivered):
            sent = {**p, "provider_message_id": outcome.provider_message_id}
            await conn.execute(Q["outbound_delivered"], sent)
            return SENT
        if isinstance(outcome, Deferred):
            async with conn.transaction():
                await conn.execute(Q["outbound_unclaim"], p)
                if outcome.retry_after_s is not None:
                    await buckets.pause(conn, buckets.account_key(str(row["account"])),
                                        outcome.retry_after_s)  # fmt: skip
            raise SendWait(outcome.reason, outcome.retry_after_s or 1.0)
        if isinstance(outcome, Refused):
            why = cause(outcome)
            async with conn.transaction():
                await conn.execute(Q["outbound_refused"], {**p, "error": why})
                await _raise(conn, row, names.ATTENTION_SEND_FAILED,
                             f"outbox row {row['id']} was refused: {why}",
                             names.ACTION_RETRY)  # fmt: skip
            log.warning("outbox row %d refused: %s", row["id"], why)
            return FAILED
        if isinstance(outcome, Held):  # the channel's rules hold it; the provider was not called
            async with conn.transaction():
                await conn.execute(Q["outbound_held"], {**p, "reason": outcome.reason})
                await _raise(conn, row, names.ATTENTION_SEND_HELD,
                             f"outbox row {row['id']} is held: {outcome.reason}",
                             names.ACTION_RETRY)  # fmt: skip
            log.info("outbox row %d held: %s", row["id"], outcome.reason)
            return HELD
        calls = int(row.get("attempts") or 0) + 1  # this attempt's claim counted one more
        if idempotent and calls < UNCLEAR_RETRIES:
            # The provider deduplicates on our key: calling again cannot make a second send.
            await conn.execute(Q["outbound_unclaim"], p)
            raise SendWait(f"unclear, called again with the same key: {outcome.reason}",
                           float(2**calls))  # fmt: skip
        await self._unknown(conn, row, token, cause(outcome))
        return UNKNOWN

    async def _unknown(self, conn: Conn, row: dict[str, Any], token: str, reason: str) -> None:
        async with conn.transaction():
            p = {"id": row["id"], "token": token, "error": reason[:500]}
            cur = await conn.execute(Q["outbound_unknown"], p)
            if cur.rowcount:
                await _raise(conn, row, names.ATTENTION_SEND_UNKNOWN,
                             f"outbox row {row['id']} may or may not have been sent: {reason}",
                             names.ACTION_RETRY)  # fmt: skip
        log.warning("outbox row %d is unknown: %s", row["id"], reason)


async def request_retry(conn: Conn, outbound_id: int) -> dict[str, Any]:
    """The owner's Retry of an `unknown`, `failed` or channel-held send: queued again for
    the egress."""
    async with conn.transaction():
        cur = await conn.execute(Q["outbound_retry_request"], {"id": outbound_id})
        row = await cur.fetchone()
        if row is None:
            status = (await _get(conn, outbound_id))["status"]
            raise Conflict(f"outbox row {outbound_id} is {status}; only unknown, failed or "
                           "channel-held sends can be retried")  # fmt: skip
        for kind in SEND_ITEM_KINDS:
            ref = {"kind": kind, "ref": f"outbox#{outbound_id}"}
            await conn.execute(Q["attention_resolve"], ref)
    return dict(row)


async def retry_loop(egress: Egress, poll_s: float = RETRY_POLL_S) -> None:
    """Send what owners retried, oldest request first (a service loop of egress)."""
    while True:
        try:
            async with egress.pool.connection() as conn:
                cur = await conn.execute(Q["outbound_retries_due"], {"limit": RETRY_BATCH})
                due = [int(r["id"]) for r in await cur.fetchall()]
            for outbound_id in due:
                try:
                    await egress.send(outbound_id)
                except SendWait as exc:
                    log.info("retried outbox row %d waits: %s", outbound_id, exc)
        except (DatabaseUnavailable, psycopg.Error, OSError) as exc:
            # The database lost (PoolTimeout is a psycopg.Error): the next round tries again;
            # leaving the loop stopped the whole egress service (the fault run).
            log.warning("egress retries: %s: %s", type(exc).__name__, exc)
        await asyncio.sleep(poll_s)


async def retry_item(conn: Conn, item: Mapping[str, Any]) -> int:
    """The Retry action of a send's attention item (locked by the caller): its outbox row
    queued again (Conflict unless it is unknown, failed or held by its channel)."""
    outbound_id = int(str(item["ref"]).removeprefix("outbox#"))
    await request_retry(conn, outbound_id)
    return outbound_id
