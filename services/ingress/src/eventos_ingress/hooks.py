"""`POST /hooks/{path}` (SPEC §6.1): resolve, cap, verify, normalize, append, commit, answer."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from psycopg_pool import AsyncConnectionPool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from eventos import names
from eventos.blobs import BlobStore
from eventos.bus import Accepted, GroupCommitter, IngressRecord, Rejected
from eventos.db import Conn
from eventos.envelope import encoded_size, http_envelope, kept_headers, new_event_id
from eventos.errors import DatabaseUnavailable, SecretUnavailable, SignatureInvalid
from eventos.metrics import INGRESS_ANSWERS, INGRESS_APPEND_SECONDS
from eventos.settings import SecretStore
from eventos.verify import VerifyConfig, provider_dedupe_key, secret_headers, verify
from eventos.wake import Kicker
from eventos_ingress.limits import HookLimits, SourceLimits
from eventos_ingress.routes import Endpoint, RouteTable

log = logging.getLogger(__name__)
RETRY_AFTER_UNAVAILABLE = "5"
# Below this a body's envelope stays under 64 KB even if JSON re-encoding triples it.
INLINE_CHECK_FROM = 16 * 1024


class BodyTooLarge(Exception):
    """The body passed the endpoint's cap."""


def _answer(code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    INGRESS_ANSWERS.labels(str(code)).inc()
    return JSONResponse(body, status_code=code, headers=headers)


def _unavailable(reason: str) -> Response:
    return _answer(503, {"error": reason}, {"Retry-After": RETRY_AFTER_UNAVAILABLE})


async def read_capped(request: Request, cap: int) -> bytes:
    """The body, refusing as soon as it passes `cap` (whatever Content-Length claimed)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def _decode_body(
    endpoint: Endpoint, headers: dict[str, str], body: bytes
) -> tuple[object, str | None]:
    """The body as JSON (or text), and a reason when a verified body is malformed."""
    wants_json = endpoint.signed or "json" in headers.get("content-type", "")
    if not wants_json:
        return body.decode("utf-8", errors="replace"), None
    try:
        return json.loads(body), None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return body[: names.PREVIEW_BYTES].decode("utf-8", errors="replace"), "malformed"


@dataclass
class Hooks:
    """The webhook endpoint handler and its caches."""

    pool: AsyncConnectionPool[Conn]
    committer: GroupCommitter
    secrets: SecretStore
    blobs: BlobStore
    routes: RouteTable
    kicker: Kicker | None = None
    hook_limits: HookLimits = field(default_factory=HookLimits)
    limits: SourceLimits = field(default_factory=SourceLimits)

    async def handle(self, request: Request) -> Response:
        started = time.perf_counter()
        path = str(request.path_params.get("path", ""))
        if not path.strip("/"):
            return _answer(401, {"error": "an empty path never matches"})
        try:
            endpoint = await self.routes.resolve(path)
        except DatabaseUnavailable:
            return _unavailable("database unavailable")
        except Exception:
            log.exception("endpoint lookup failed")
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

    async def _accept(self, request: Request, endpoint: Endpoint) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > endpoint.max_body:
            return _answer(413, {"error": f"body over {endpoint.max_body} bytes"})
        try:
            body = await read_capped(request, endpoint.max_body)
        except BodyTooLarge:
            return _answer(413, {"error": f"body over {endpoint.max_body} bytes"})
        except ClientDisconnect:
            return _answer(400, {"error": "client disconnected"})
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            secret = self.secrets.resolve(endpoint.secret_ref) if endpoint.secret_ref else None
            cfg = VerifyConfig(endpoint.scheme, secret, endpoint.header, endpoint.tolerance_s)
            verify(cfg, headers, body, time.time())
        except SecretUnavailable:
            return _unavailable("secret unavailable")
        except SignatureInvalid as exc:
            return _answer(401, {"error": str(exc)})
        limit = self.hook_limits.signed if endpoint.signed else self.hook_limits.generic
        wait = self.limits.retry_after(endpoint.source_key, limit)
        if wait:
            return _answer(429, {"error": "rate limit"}, {"Retry-After": str(wait)})
        try:
            if await self.routes.backlog(endpoint.source_key, limit.high_water) >= limit.high_water:
                return _answer(429, {"error": "backlog over high water"}, {"Retry-After": "10"})
            record = await self._record(endpoint, cfg, headers, body)
            outcome = await self.committer.submit(record)
        except Exception as exc:
            log.warning("append failed: %s", exc)
            return _unavailable("append failed")
        if isinstance(outcome, Rejected):
            return _answer(400, {"error": outcome.reason})
        if self.kicker is not None:
            self.kicker.kick()
        status = "accepted" if isinstance(outcome, Accepted) else "duplicate"
        return _answer(200, {"status": status, "id": outcome.id})

    async def _record(
        self,
        endpoint: Endpoint,
        cfg: VerifyConfig,
        headers: dict[str, str],
        body: bytes,
    ) -> IngressRecord:
        decoded, malformed = _decode_body(endpoint, headers, body)
        dedupe_key, ttl = self._dedupe(endpoint, headers, body)
        kept = kept_headers(
            headers,
            extra=[endpoint.dedupe_header] if endpoint.dedupe_header else [],
            secret=secret_headers(cfg),
        )
        event_id = new_event_id()

        def build(body_ref: str | None) -> dict[str, Any]:
            shown = (
                decoded
                if body_ref is None
                else body[: names.PREVIEW_BYTES].decode("utf-8", "replace")
            )
            return http_envelope(path=endpoint.path, event_type=names.TYPE_WEBHOOK, headers=kept,
                                 body=shown, event_id=event_id, body_ref=body_ref)  # fmt: skip

        body_ref = None
        envelope = build(None)
        # Nothing over 64 KB enters the bus inline (I7). Small bodies cannot get there (header
        # values are capped), so only larger ones pay for measuring the encoded envelope.
        if len(body) > names.ENVELOPE_MAX_BYTES or (
            len(body) > INLINE_CHECK_FROM and encoded_size(envelope) > names.ENVELOPE_MAX_BYTES
        ):
            async with self.pool.connection() as conn:
                body_ref = await self.blobs.record(conn, body)
            envelope = build(body_ref)
        return IngressRecord(
            source_key=endpoint.source_key,
            dedupe_key=dedupe_key,
            type=names.TYPE_WEBHOOK,
            chain_id=event_id,
            envelope=envelope,
            size=len(body),
            klass=endpoint.klass,
            body_ref=body_ref,
            path=endpoint.path,
            status=names.INGRESS_DEAD if malformed else names.INGRESS_ACCEPTED,
            error=malformed,
            dedupe_ttl_s=ttl,
        )

    def _dedupe(self, endpoint: Endpoint, headers: dict[str, str], body: bytes) -> tuple[str, int]:
        """Provider id, else the configured header, else a body hash for 10 minutes."""
        week = names.DEDUPE_TTL_DAYS * 86400
        key = provider_dedupe_key(endpoint.scheme, headers, body)
        if key:
            return key, week
        if endpoint.dedupe_header:
            value = headers.get(endpoint.dedupe_header.lower())
            if value:
                return f"h:{value}", week
        return "sha256:" + hashlib.sha256(body).hexdigest(), names.BODY_HASH_DEDUPE_SECONDS
