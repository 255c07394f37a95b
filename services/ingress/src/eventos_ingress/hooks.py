"""`POST /hooks/{path}` (SPEC §6.1): resolve, cap, verify, normalize, append, commit, answer.

The body is streamed: the signature's HMAC is computed as it arrives and the bytes go to a
spool (memory up to 64 KiB, a temporary file past that), so no request holds a large body in
memory. A verified body PostgreSQL cannot store as JSON (a NUL, a lone surrogate, nesting past
the limit, not JSON at all where JSON is due) is still answered 200 and stored once as
`dead(malformed: <why>)`, its raw bytes kept as a blob for an operator to read.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos import secret_purposes as purposes
from eventos.bus import blobs
from eventos.bus.blobs import Spool
from eventos.bus.envelope import (
    HEADER_VALUE_MAX,
    encoded_size,
    http_envelope,
    kept_headers,
    new_event_id,
)
from eventos.bus.inbox import Accepted, GroupCommitter, IngressRecord, Rejected
from eventos.bus.jsonsafe import REASON_NUL, loads_storable, safe_text
from eventos.bus.verify import (
    PREVIOUS,
    BodyCheck,
    VerifyConfig,
    provider_dedupe_key,
    secret_headers,
    start_check,
)
from eventos.db import Conn
from eventos.errors import QueueFull, SecretUnavailable, SignatureInvalid
from eventos.runtime.metrics import (
    INGRESS_ANSWERS,
    INGRESS_APPEND_SECONDS,
    WEBHOOK_PREVIOUS_SECRET,
    count_dead,
)
from eventos.runtime.wake import Kicker
from eventos.settings import SecretStore
from eventos_ingress.limits import HookLimits, SourceLimits
from eventos_ingress.raw_http import Answer, ClientDisconnect, HookRequest
from eventos_ingress.routes import Endpoint, RouteTable

log = logging.getLogger(__name__)
RETRY_AFTER_UNAVAILABLE = "5"
# Below this a body's envelope stays under 64 KB even if JSON re-encoding triples it.
INLINE_CHECK_FROM = 16 * 1024
MALFORMED = "malformed"
VERIFIED_WITH = "verifiedwith"  # an envelope's mark: signed with a rotated secret's previous value
PREVIOUS_LOG_EVERY_S = 60.0


class BodyTooLarge(Exception):
    """The body passed the endpoint's cap."""


class BodyStalled(Exception):
    """No part of the body arrived within the read timeout."""


def _answer(code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    INGRESS_ANSWERS.labels(str(code)).inc()
    return Answer(code, body, headers)


def _unavailable(reason: str) -> Answer:
    return _answer(503, {"error": reason}, {"Retry-After": RETRY_AFTER_UNAVAILABLE})


async def receive_body(
    request: HookRequest, cap: int, spool: Spool, feed: list[BodyCheck], idle_timeout_s: float
) -> None:
    """Stream the body into `spool` (and each check in `feed`), refusing as soon as it passes
    `cap` (whatever Content-Length claimed) or stalls for `idle_timeout_s`."""
    loop = asyncio.get_running_loop()
    # One deadline for the whole body, moved on by each chunk that has more after it: a
    # timeout per chunk cost a context and a timer each (about 5% of a small webhook's CPU
    # at saturation), and a body in one message (most of them) now costs one timer.
    try:
        async with asyncio.timeout(idle_timeout_s) as deadline:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                more = message.get("more_body", False)
                if more:
                    deadline.reschedule(loop.time() + idle_timeout_s)
                chunk = message.get("body", b"")
                if spool.size + len(chunk) > cap:
                    raise BodyTooLarge()
                if chunk:
                    await spool.write(chunk, feed)
                if not more:
                    return
    except TimeoutError:
        raise BodyStalled() from None


def _wants_json(endpoint: Endpoint, headers: dict[str, str]) -> bool:
    return endpoint.signed or "json" in headers.get("content-type", "")


def _decode(endpoint: Endpoint, headers: dict[str, str], body: bytes) -> tuple[object, str | None]:
    """The body as JSON (or text), and why a verified body is malformed."""
    if _wants_json(endpoint, headers):
        return loads_storable(body)
    text = body.decode("utf-8", errors="replace")
    return (None, REASON_NUL) if "\x00" in text else (text, None)


@dataclass
class Hooks:
    """The webhook endpoint handler and its caches."""

    pool: AsyncConnectionPool[Conn]
    committer: GroupCommitter
    secrets: SecretStore
    routes: RouteTable
    kicker: Kicker | None = None
    hook_limits: HookLimits = field(default_factory=HookLimits)
    limits: SourceLimits = field(default_factory=SourceLimits)
    body_idle_timeout_s: float = 30.0
    spool_dir: str | None = None
    # Decoding a large body (for its provider id and to know it is well-formed) holds it
    # whole in memory: one at a time per process.
    _large_decodes: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    # Blob writes share the pool with the group commit: a few at a time, so a wave of large
    # uploads never starves small webhooks of connections (the waiting bodies are on disk).
    _blob_writes: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2))
    _previous_logged: dict[str, float] = field(default_factory=dict)  # path: when last said

    async def handle(self, request: HookRequest) -> Answer:
        started = time.perf_counter()
        path = request.path
        if not path.strip("/"):
            return _answer(401, {"error": "an empty path never matches"})
        try:
            endpoint = await self.routes.resolve(path)
        except Exception as exc:
            log.warning("endpoint lookup failed: %s", exc)
            return _unavailable("database unavailable")
        if endpoint is None:
            return _answer(404, {"error": f"no running employee declares /hooks/{path}"})
        if request.method != "POST":
            return _answer(405, {"error": "use POST"}, {"Allow": "POST"})
        response = await self._accept(request, endpoint)
        kind = "signed" if endpoint.signed else "generic"
        outcome = str(response.status_code)
        INGRESS_APPEND_SECONDS.labels(kind, outcome).observe(time.perf_counter() - started)
        return response

    async def _accept(self, request: HookRequest, endpoint: Endpoint) -> Answer:
        headers = request.headers
        declared = headers.get("content-length")
        # The server refused any other form of it (eventos.runtime.http_bounds).
        if declared is not None and declared.isdigit() and int(declared) > endpoint.max_body:
            return _answer(413, {"error": f"body over {endpoint.max_body} bytes"})
        try:
            ref = endpoint.secret_ref
            found = self.secrets.versions(ref, purposes.WEBHOOK) if ref else None
            cfg = VerifyConfig(endpoint.scheme, found.current if found else None, endpoint.header,
                               endpoint.tolerance_s, found.previous if found else None)  # fmt: skip
            check = start_check(cfg, headers, time.time())
        except SecretUnavailable:
            return _unavailable("secret unavailable")
        except SignatureInvalid as exc:
            return _answer(401, {"error": str(exc)})
        spool = Spool(self.spool_dir)
        try:
            return await self._receive(request, endpoint, cfg, check, headers, spool)
        finally:
            spool.close()

    async def _receive(
        self,
        request: HookRequest,
        endpoint: Endpoint,
        cfg: VerifyConfig,
        check: BodyCheck,
        headers: dict[str, str],
        spool: Spool,
    ) -> Answer:
        try:
            await receive_body(request, endpoint.max_body, spool, [check],
                               self.body_idle_timeout_s)  # fmt: skip
            check.finish()
        except BodyTooLarge:
            return _answer(413, {"error": f"body over {endpoint.max_body} bytes"})
        except BodyStalled:
            return _answer(408, {"error": f"no body data for {self.body_idle_timeout_s:g} s"},
                           {"Connection": "close"})  # fmt: skip
        except ClientDisconnect:
            return _answer(400, {"error": "client disconnected"})
        except SignatureInvalid as exc:
            return _answer(401, {"error": str(exc)})
        if check.verified_with == PREVIOUS:
            self._signed_with_previous(endpoint)
        limit = self.hook_limits.signed if endpoint.signed else self.hook_limits.generic
        wait = self.limits.retry_after(endpoint.source_key, limit)
        if wait:
            return _answer(429, {"error": "rate limit"}, {"Retry-After": str(wait)})
        try:
            if await self.routes.backlog(endpoint.source_key, limit.high_water) >= limit.high_water:
                return _answer(429, {"error": "backlog over high water"}, {"Retry-After": "10"})
            record = await self._record(endpoint, cfg, headers, spool)
            outcome = await self.committer.submit(_marked(record, check.verified_with))
            if isinstance(outcome, Rejected):
                # Stored dead with its raw bytes, so the provider stops retrying (SPEC §6.1).
                record = await self._dead(record, spool, f"{MALFORMED}: {outcome.reason}")
                outcome = await self.committer.submit(_marked(record, check.verified_with))
        except QueueFull as exc:
            return _unavailable(str(exc))
        except Exception as exc:
            log.warning("append failed: %s", exc)
            return _unavailable("append failed")
        if isinstance(outcome, Rejected):
            log.warning("a dead record was refused too: %s", outcome.reason)
            return _unavailable("append failed")
        if record.status == names.INGRESS_DEAD and isinstance(outcome, Accepted):
            count_dead(record.error)
        if self.kicker is not None:
            self.kicker.kick()
        status = "accepted" if isinstance(outcome, Accepted) else "duplicate"
        return _answer(200, {"status": status, "id": outcome.id})

    def _signed_with_previous(self, endpoint: Endpoint) -> None:
        """Say, at most once a minute per path, that a sender still signs with the secret a
        rotation replaced (the event itself records it: `verifiedwith: previous`)."""
        WEBHOOK_PREVIOUS_SECRET.inc()
        now = time.monotonic()
        if now - self._previous_logged.get(endpoint.path, float("-inf")) >= PREVIOUS_LOG_EVERY_S:
            self._previous_logged[endpoint.path] = now
            log.warning("/hooks/%s was signed with the previous value of secret %r; the sender "
                        "must switch before the overlap window ends", endpoint.path,
                        endpoint.secret_ref)  # fmt: skip

    async def _record(
        self, endpoint: Endpoint, cfg: VerifyConfig, headers: dict[str, str], spool: Spool
    ) -> IngressRecord:
        if spool.in_memory:
            body = spool.value()
            decoded, malformed = _decode(endpoint, headers, body)
            dedupe_key, ttl = self._dedupe(endpoint, headers, body)
        else:
            decoded = None  # stored by reference: only a preview goes inline
            malformed, dedupe_key, ttl = await self._inspect_large(endpoint, headers, spool)
        kept = kept_headers(
            headers,
            extra=[endpoint.dedupe_header] if endpoint.dedupe_header else [],
            secret=secret_headers(cfg),
        )
        record = IngressRecord(
            source_key=endpoint.source_key,
            dedupe_key=dedupe_key,
            type=names.TYPE_WEBHOOK,
            chain_id=new_event_id(),
            envelope=None,
            size=spool.size,
            klass=endpoint.klass,
            path=endpoint.path,
            dedupe_ttl_s=ttl,
        )
        if malformed:
            return await self._by_reference(record, kept, spool, f"{MALFORMED}: {malformed}")
        envelope = _envelope(record, kept, decoded, None)
        # Nothing over 64 KB enters the bus inline (I7). Small bodies cannot get there (header
        # values are capped), so only larger ones pay for measuring the encoded envelope.
        if not spool.in_memory or (
            spool.size > INLINE_CHECK_FROM and encoded_size(envelope) > names.ENVELOPE_MAX_BYTES
        ):
            return await self._by_reference(record, kept, spool)
        return replace(record, envelope=envelope)

    async def _inspect_large(
        self, endpoint: Endpoint, headers: dict[str, str], spool: Spool
    ) -> tuple[str | None, str, int]:
        """Why a large body is malformed, and its dedupe key. Only a body due to be JSON is read
        whole (to know it is well-formed and to find a provider's id), one at a time, and
        dropped before anything else waits; any other body stays in its spool."""
        if not _wants_json(endpoint, headers):
            return None, *self._dedupe(endpoint, headers, b"", spool.sha256)
        async with self._large_decodes:
            body = await spool.read_all()
            _, malformed = await asyncio.to_thread(_decode, endpoint, headers, body)
            dedupe_key, ttl = self._dedupe(endpoint, headers, body, spool.sha256)
            del body
        return malformed, dedupe_key, ttl

    async def _by_reference(
        self, record: IngressRecord, kept: dict[str, str], spool: Spool, error: str | None = None
    ) -> IngressRecord:
        """The record with its body written to the blob store and a 4 KB preview inline; with
        an `error`, stored `dead` with it."""
        async with self._blob_writes, self.pool.connection() as conn:
            body_ref = await blobs.store(conn, spool if not spool.in_memory else spool.value())
        preview = safe_text(spool.head(names.PREVIEW_BYTES), names.PREVIEW_BYTES)
        status = names.INGRESS_DEAD if error else names.INGRESS_ACCEPTED
        envelope = _envelope(record, kept, preview, body_ref)
        return replace(record, envelope=envelope, body_ref=body_ref, status=status, error=error)

    async def _dead(self, record: IngressRecord, spool: Spool, error: str) -> IngressRecord:
        """A record PostgreSQL refused, as `dead(malformed)`: its raw bytes as a blob and only
        text that can be stored inline (the bus stores its dedupe key safely)."""
        data = (record.envelope or {}).get("data", {})
        kept = {str(k): safe_text(str(v).encode("utf-8", "replace"), HEADER_VALUE_MAX)
                for k, v in data.get("headers", {}).items()}  # fmt: skip
        return await self._by_reference(replace(record, body_ref=None), kept, spool, error)

    def _dedupe(
        self, endpoint: Endpoint, headers: dict[str, str], body: bytes, digest: str | None = None
    ) -> tuple[str, int]:
        """Provider id, else the configured header, else a body hash for 10 minutes."""
        week = names.DEDUPE_TTL_DAYS * 86400
        key = provider_dedupe_key(endpoint.scheme, headers, body, digest)
        if key:
            return key, week
        if endpoint.dedupe_header:
            value = headers.get(endpoint.dedupe_header.lower())
            if value:
                return f"h:{value}", week
        digest = digest or hashlib.sha256(body).hexdigest()
        return "sha256:" + digest, names.BODY_HASH_DEDUPE_SECONDS


def _marked(record: IngressRecord, verified_with: str) -> IngressRecord:
    """The record, its envelope saying (a CloudEvents extension attribute) that it was signed
    with a rotated secret's previous value, so operators see who has not switched yet."""
    if verified_with != PREVIOUS or record.envelope is None:
        return record
    return replace(record, envelope={**record.envelope, VERIFIED_WITH: PREVIOUS})


def _envelope(
    record: IngressRecord, kept: dict[str, str], shown: object, body_ref: str | None
) -> dict[str, Any]:
    return http_envelope(path=str(record.path), event_type=record.type, headers=kept,
                         body=shown, event_id=record.chain_id, body_ref=body_ref)  # fmt: skip
