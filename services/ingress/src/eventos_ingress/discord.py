"""`POST /channels/discord/{account}`: Discord's HTTP interactions (SPEC §6.4).

Discord waits 3 s for an answer and never sends an interaction again, so the whole request is
bounded: a small body read within a short timeout, the Ed25519 signature checked (401 when
wrong: Discord itself probes the endpoint with bad signatures), a PING answered PONG, and an
application command appended under a statement timeout before "deferred" (type 5) is answered.
Anything that keeps the append from committing answers 500 ("This interaction failed" for the
user), never a deferral that no reply would follow.

`{account}` is looked up first among the Discord accounts the routing generations read, and
anything else is 404 before a byte of the body is read or the secret store is asked: the
endpoint is unauthenticated, and must not tell which secret names exist. An account that is
read but whose secret is missing or not a Discord credential is the operator's to fix: 503,
logged once (again only after it worked in between), not on every request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos import secret_purposes as purposes
from eventos.bus.inbox import Accepted, Duplicate, Rejected, append, append_isolated
from eventos.channels.discord import (
    DRIVER,
    DiscordCredential,
    DiscordCredentialError,
    interaction_record,
    parse_credential,
    verify,
)
from eventos.channels.readers import unstorable
from eventos.channels.threads import instance_salt
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import DatabaseUnavailable, SecretUnavailable
from eventos.runtime.wake import Kicker
from eventos.settings import SecretStore
from eventos_ingress.raw_http import Answer, ClientDisconnect, HookRequest

log = logging.getLogger(__name__)
PREFIX = "/channels/discord/"
ACCOUNT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")  # a secret name: no path in it
BODY_MAX = 64 * 1024  # an interaction is a few KiB
BODY_TIMEOUT_S = 0.5
POOL_TIMEOUT_S = 0.5
STATEMENT_TIMEOUT_MS = 1500
APPEND_TIMEOUT_S = 2.0  # with the body's bound, inside Discord's 3 s
STAMP_SKEW_S = 300  # a signed request older (or newer) than this is a replay
PING, COMMAND = 1, 2
PONG, DEFERRED, MESSAGE = 1, 5, 4
EPHEMERAL = 1 << 6
UNREADABLE = "This command could not be read."
UNANSWERED = "No one answers commands here right now."
RETRY_AFTER = "30"
# The one answer for every name that is not a read account, whether or not a secret has it.
UNKNOWN = Answer(404, {"error": "unknown account"})


class BodyRefused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


async def read_body(request: HookRequest) -> bytes:
    """The whole body, at most BODY_MAX bytes, within BODY_TIMEOUT_S."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > BODY_MAX:
                    raise BodyRefused(413, f"body over {BODY_MAX} bytes")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise BodyRefused(408, "body not received in time") from None


def fresh(stamp: str | None) -> bool:
    try:
        return stamp is not None and abs(time.time() - int(stamp)) <= STAMP_SKEW_S
    except ValueError:
        return False


class DiscordInteractions:
    """The interactions endpoint of every Discord account (its secret names its key)."""

    def __init__(self, pool: AsyncConnectionPool[Conn], secrets: SecretStore,
                 kicker: Kicker | None) -> None:  # fmt: skip
        self.pool, self.secrets, self.kicker = pool, secrets, kicker
        self.salt: bytes | None = None
        self.misconfigured: set[str] = set()  # accounts logged as such (logged once)

    async def handle(self, request: HookRequest) -> Answer:
        if request.method != "POST":
            return Answer(405, {"error": "POST only"}, {"Allow": "POST"})
        account = request.path
        if not ACCOUNT.fullmatch(account):
            return UNKNOWN
        try:
            if not await self._read_by_an_employee(account):
                return UNKNOWN
        except (DatabaseUnavailable, psycopg.Error, TimeoutError, OSError) as exc:
            log.warning("discord account lookup failed: %s", exc)
            return Answer(503, {"error": "database unavailable"}, {"Retry-After": RETRY_AFTER})
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > BODY_MAX:  # the server checked its form
            return Answer(413, {"error": f"body over {BODY_MAX} bytes"})
        try:
            body = await read_body(request)
        except BodyRefused as exc:
            return Answer(exc.status, {"error": exc.reason})
        except ClientDisconnect:
            return Answer(400, {"error": "client went away"})
        try:
            cred = parse_credential(self.secrets.resolve(account, purposes.CHANNEL))
        except (SecretUnavailable, DiscordCredentialError) as exc:
            if account not in self.misconfigured:
                self.misconfigured.add(account)
                log.error("discord account %s: %s (logged once until it works)", account, exc)
            return Answer(503, {"error": "account misconfigured"}, {"Retry-After": RETRY_AFTER})
        self.misconfigured.discard(account)
        headers = request.headers
        stamp = headers.get("x-signature-timestamp")
        if not fresh(stamp) or not verify(cred.public_key, headers.get("x-signature-ed25519"),
                                          stamp, body):  # fmt: skip
            return Answer(401, {"error": "invalid request signature"})
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return Answer(400, {"error": "not JSON"})
        kind = doc.get("type") if isinstance(doc, dict) else None
        if kind == PING:
            return Answer(200, {"type": PONG})
        if kind != COMMAND:
            return Answer(400, {"error": "only application commands are taken"})
        try:
            stored = await self._append(account, cred, doc)
        except (DatabaseUnavailable, psycopg.Error, TimeoutError, OSError) as exc:
            log.warning("discord account %s: interaction not stored: %s", account, exc)
            return Answer(500, {"error": "not stored"})
        if self.kicker is not None and stored is None:
            self.kicker.kick()
        if stored is not None:
            return Answer(200, {"type": MESSAGE, "data": {"content": stored,
                                                          "flags": EPHEMERAL}})  # fmt: skip
        return Answer(200, {"type": DEFERRED})

    async def _read_by_an_employee(self, account: str) -> bool:
        """Whether a generation that routes events (starting, running, paused) reads the
        account: one indexed lookup, under the same bounds as the append."""
        states = list(names.ROUTABLE_GENERATION_STATES)
        async with (
            asyncio.timeout(APPEND_TIMEOUT_S),
            self.pool.connection(timeout=POOL_TIMEOUT_S) as conn,
        ):
            cur = await conn.execute(
                Q["channel_account_routable"], {"id": f"{DRIVER}:{account}", "states": states}
            )
            return bool((await cur.fetchone() or {}).get("routable"))

    async def _append(self, account: str, cred: DiscordCredential,
                      doc: dict[str, Any]) -> str | None:  # fmt: skip
        """Append the interaction: None once committed as an input (or a duplicate of one);
        else what to tell the user at once, as no reply will follow (no employee reads the
        account: nothing stored; the command unstorable: stored as a dead row)."""
        source = f"{DRIVER}:{account}"
        states = list(names.ROUTABLE_GENERATION_STATES)
        async with (
            asyncio.timeout(APPEND_TIMEOUT_S),
            self.pool.connection(timeout=POOL_TIMEOUT_S) as conn,
            conn.transaction(),
        ):
            await conn.execute(Q["statement_timeout_local"], {"ms": str(STATEMENT_TIMEOUT_MS)})
            if self.salt is None:
                self.salt = await instance_salt(conn)
            cur = await conn.execute(
                Q["channel_account_routable"], {"id": source, "states": states}
            )
            if not (await cur.fetchone() or {}).get("routable"):
                return UNANSWERED
            record = interaction_record(source, self.salt, cred, doc)
            (outcome,) = await append_isolated(conn, [record])
            if isinstance(outcome, Rejected):
                await append(conn, [unstorable(record, outcome.reason)])
                return UNREADABLE
        stored = isinstance(outcome, Accepted | Duplicate) and record.error is None
        return None if stored else UNREADABLE
