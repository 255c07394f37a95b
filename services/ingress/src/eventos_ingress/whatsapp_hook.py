"""`/channels/whatsapp/{account}`: Meta's webhook for a WhatsApp Business account (SPEC §6.4).

GET is the subscription check: `hub.mode=subscribe` with the account's verify token answers
`hub.challenge`, anything else 403. POST is a notification: the signature
(`X-Hub-Signature-256`, HMAC-SHA256 of the raw body under the app secret) is checked as the
body streams in (401 on a mismatch, nothing stored), then its messages are appended, the
customers' windows opened and the statuses' receipts moved, in ONE transaction; 200 only after
it committed, else 503 (or 500) and Meta delivers the notification again. An account no running
generation subscribes to is 404. An account past its backlog bound (SPEC §15) answers a signed
notification 429 with Retry-After and appends nothing: Meta sends it again (for up to 7 days).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import parse_qs

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos import secret_purposes as purposes
from eventos.bus.blobs import Spool
from eventos.bus.inbox import Accepted, Duplicate, Rejected, append, append_isolated
from eventos.bus.verify import PREVIOUS, VerifyConfig, start_check
from eventos.channels import whatsapp
from eventos.channels.backlog import account_backlog, raise_pause, resolve_pause
from eventos.channels.readers import unstorable
from eventos.channels.threads import instance_salt
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import DatabaseUnavailable, SecretUnavailable, SignatureInvalid
from eventos.runtime.metrics import INGRESS_ANSWERS, WEBHOOK_PREVIOUS_SECRET
from eventos.runtime.wake import Kicker
from eventos.secret_files import SecretVersions
from eventos.settings import SecretStore
from eventos_ingress.hooks import BodyStalled, BodyTooLarge, receive_body
from eventos_ingress.raw_http import Answer, ClientDisconnect, HookRequest

log = logging.getLogger(__name__)
PREFIX = "/channels/whatsapp/"
SCHEME = "whatsapp-business"
MAX_BODY = 1024 * 1024  # Meta's notifications are a few KB; a batch of statuses stays far below
CHALLENGE_MAX = 256
RETRY_AFTER = {"Retry-After": "5"}
BACKLOG_RETRY_AFTER = {"Retry-After": "30"}
_ACCOUNT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass
class WhatsAppHook:
    """The webhook of every WhatsApp Business account a running generation reads."""

    pool: AsyncConnectionPool[Conn]
    secrets: SecretStore
    kicker: Kicker | None = None
    body_idle_timeout_s: float = 30.0
    max_body: int = MAX_BODY
    backlog_max: int = 5000
    _salt: bytes | None = field(default=None, repr=False)

    async def handle(self, request: HookRequest) -> Answer:
        answer = await self._handle(request)
        INGRESS_ANSWERS.labels(str(answer.status_code)).inc()
        return answer

    async def _handle(self, request: HookRequest) -> Answer:
        account = request.path.strip("/")
        if not _ACCOUNT.match(account):
            return Answer(404, {"error": "not a WhatsApp account's webhook"})
        source = f"{whatsapp.DRIVER}:{account}"
        try:
            async with self.pool.connection() as conn:
                cur = await conn.execute(Q["whatsapp_account_subscribed"], {"source_key": source})
                subscribed = await cur.fetchone() is not None
                if self._salt is None:
                    self._salt = await instance_salt(conn)
        except (DatabaseUnavailable, OSError) as exc:
            log.warning("whatsapp %s: account lookup failed: %s", account, exc)
            return Answer(503, {"error": "database unavailable"}, RETRY_AFTER)
        if not subscribed:
            return Answer(404, {"error": f"no running employee reads WhatsApp account {account}"})
        try:
            found = self.secrets.versions(account, purposes.CHANNEL)
            cred = whatsapp.parse_credential(found.current, account)
        except SecretUnavailable as exc:  # CredentialInvalid too: says what is wrong, no value
            log.error("whatsapp %s: %s", account, exc)
            return Answer(503, {"error": "the account's credential is unavailable"}, RETRY_AFTER)
        if request.method == "GET":
            return _verification(request, cred)
        if request.method != "POST":
            return Answer(405, {"error": "use GET or POST"}, {"Allow": "GET, POST"})
        return await self._notification(request, source, cred, _previous_app_secret(found))

    async def _notification(self, request: HookRequest, source: str, cred: whatsapp.Credential,
                            previous: bytes | None = None) -> Answer:  # fmt: skip
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return Answer(413, {"error": f"body over {self.max_body} bytes"})
        spool = Spool()
        try:
            cfg = VerifyConfig(SCHEME, cred.app_secret.encode(), previous=previous)
            check = start_check(cfg, request.headers, time.time())
            await receive_body(request, self.max_body, spool, [check], self.body_idle_timeout_s)
            check.finish()
            if check.verified_with == PREVIOUS:
                WEBHOOK_PREVIOUS_SECRET.inc()
            body = spool.value() if spool.in_memory else await spool.read_all()
        except SignatureInvalid as exc:
            return Answer(401, {"error": str(exc)})
        except BodyTooLarge:
            return Answer(413, {"error": f"body over {self.max_body} bytes"})
        except BodyStalled:
            return Answer(408, {"error": "the body stalled"}, {"Connection": "close"})
        except ClientDisconnect:
            return Answer(400, {"error": "client disconnected"})
        finally:
            spool.close()
        try:
            if await self._past_bound(source):
                return Answer(429, {"error": "the account's backlog is past its bound; "
                                    "send again later"}, BACKLOG_RETRY_AFTER)  # fmt: skip
            return await self._store(source, cred, body)
        except (DatabaseUnavailable, OSError) as exc:
            log.warning("whatsapp %s: append failed: %s", source, exc)
            return Answer(503, {"error": "append failed"}, RETRY_AFTER)

    async def _past_bound(self, source: str) -> bool:
        """Whether the account holds its bound of unconsumed inputs (its item raised); else its
        item resolved (it accepts again)."""
        async with self.pool.connection() as conn:
            backlog = await account_backlog(conn, source, self.backlog_max)
            if backlog >= self.backlog_max:
                await raise_pause(conn, source, whatsapp.DRIVER, backlog, self.backlog_max,
                                  "refused")  # fmt: skip
                return True
            await resolve_pause(conn, source)
        return False

    async def _store(self, source: str, cred: whatsapp.Credential, body: bytes) -> Answer:
        assert self._salt is not None  # read with the account's lookup
        now = datetime.now(UTC)
        try:
            payload: object = json.loads(body)
        except (ValueError, RecursionError):
            payload = None  # a dead row says so
        note = whatsapp.read_notification(source, self._salt, cred, payload, now)
        async with self.pool.connection() as conn, conn.transaction():
            outcomes = await append_isolated(conn, note.records)
            dead = [unstorable(r, o.reason) for r, o in zip(note.records, outcomes, strict=True)
                    if isinstance(o, Rejected)]  # fmt: skip
            await append(conn, dead)
            for touch in note.windows:
                await conn.execute(Q["whatsapp_window_touch"], {
                    "account": source, "counterpart": touch.counterpart, "at": touch.at,
                    "wamid": touch.wamid,
                })  # fmt: skip
            for receipt in note.receipts:
                await conn.execute(Q["outbound_receipt"], {
                    "receipt": Jsonb(receipt.body), "provider_message_id": receipt.wamid,
                    "kind": whatsapp.DRIVER, "account": source, "status": receipt.status,
                    "order": list(whatsapp.RECEIPTS),
                })  # fmt: skip
        accepted = sum(isinstance(o, Accepted) for o in outcomes)
        if accepted and self.kicker is not None:
            self.kicker.kick()
        return Answer(200, {
            "accepted": accepted, "duplicates": sum(isinstance(o, Duplicate) for o in outcomes),
            "dead": len(dead) + sum(r.status == names.INGRESS_DEAD for r in note.records),
            "statuses": len(note.receipts),
        })  # fmt: skip


def _verification(request: HookRequest, cred: whatsapp.Credential) -> Answer:
    """Meta's subscription check: the challenge back for the right verify token only."""
    try:
        query = parse_qs(request.query.decode("latin-1"), max_num_fields=10)
    except ValueError:  # more fields than a verification has
        return Answer(403, {"error": "verification refused"})
    mode = query.get("hub.mode", [""])[0]
    token = query.get("hub.verify_token", [""])[0]
    challenge = query.get("hub.challenge", [""])[0]
    right = hmac.compare_digest(token.encode("utf-8", "replace"), cred.verify_token.encode())
    if mode != "subscribe" or not right or not challenge or len(challenge) > CHALLENGE_MAX:
        return Answer(403, {"error": "verification refused"})
    return Answer(200, challenge)


def _previous_app_secret(found: SecretVersions) -> bytes | None:
    """The app secret of the account's credential before a rotation, within its overlap window
    (eventos.secret_files), when it differs from the current one."""
    if found.previous is None:
        return None
    try:
        previous = whatsapp.parse_credential(found.previous, "previous").app_secret.encode()
    except SecretUnavailable:
        return None
    current = whatsapp.parse_credential(found.current, "current").app_secret.encode()
    return previous if previous != current else None
